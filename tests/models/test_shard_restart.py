"""A rank that dies with its shard (issue 43 §4): real MLX-LM, real ranks. A tiny model loaded
sharded over 2 ranks (tensor parallel, pipeline parallel), a greedy reply, rank 1 SIGKILLed, a
restart keeping names: rank 1 remakes its own shard from the folder, rank 0 keeps its own, and the
next reply is the one before the death. The restart line says it. Then on 2 namespace hosts, and
with the folder gone from the dead rank's host.
"""

from __future__ import annotations

import pickle
import re
from pathlib import Path

import pytest

from needs import require_module

require_module("mlx_lm", "MLX-LM (pip install -e '.[test]')")

from mlx_jupyter.cluster import Cluster  # noqa: E402
from mlx_jupyter.cluster.cells.display import DistributedCellError, show_run  # noqa: E402
from mlx_jupyter.cluster.shard_restore import ShardReload, choose, held  # noqa: E402
from mlx_jupyter.models.tiny import write_tiny_model  # noqa: E402

TOKENS = 16

#: a cell loading the model: through load_sharded, or MLX-LM's own sharded_load (wrapped on the ranks)
LOAD = {
    "tensor": "from mlx_jupyter.models.sharded import load_sharded\nmodel, tokenizer = load_sharded({folder!r})",
    "pipeline": "from mlx_lm.utils import sharded_load\nmodel, tokenizer = sharded_load({folder!r}, pipeline_group=world)",
    "by hand": "import mlx_lm\nmodel, tokenizer = mlx_lm.load({folder!r})\nmodel.shard()",   # tensor parallel
}

REPLY = """
import os, time, mlx_lm
def reply():
    prompt = tokenizer.apply_chat_template([{{"role": "user", "content": "Tell me about the ranks."}}],
                                           add_generation_prompt=True)
    return [r.token for r in mlx_lm.stream_generate(model, tokenizer, prompt, max_tokens={tokens})]
before = reply()
"""

KILL = "if world.rank() == 1:\n    os.kill(os.getpid(), 9)\ntime.sleep(30)"

LOOK = """
recipe = model._mlx_jupyter_shard
made = (recipe.origin, recipe.rank, recipe.size)
layers = [l for l in model.model.layers if l is not None]
held_world = all(getattr(l.self_attn.o_proj, "group", world) is world and getattr(l.mlp.down_proj, "group", world) is world
                 for l in layers)
share = (model.model.start_idx, model.model.end_idx) if hasattr(model.model, "start_idx") else None
"""


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    return write_tiny_model(tmp_path_factory.mktemp("lm") / "tiny", layers=4, heads=4, kv_heads=4).resolve()


def _load_reply_kill_restart(c: Cluster, folder: Path, how: str) -> list:
    """Load ``how``, reply, SIGKILL rank 1, restart keeping names; each rank's reply before."""
    show_run(c.run(LOAD[how].format(folder=str(folder)) + REPLY.format(tokens=TOKENS)), timeout=120)
    before = c.pull("before")
    assert before[0] == before[1] and len(before[0]) == TOKENS
    with pytest.raises(DistributedCellError, match="rank 1 died"):
        show_run(c.run(KILL), timeout=30)
    c.restart(timeout=90, quiet=True)
    return before


@pytest.mark.timeout(240)
@pytest.mark.parametrize("how", ["tensor", "pipeline", "by hand"])
def test_the_dead_rank_reloads_its_own_shard_and_the_reply_is_the_one_before(folder, how):
    with Cluster(n=2) as c:
        before = _load_reply_kill_restart(c, folder, how)
        line = c.last_restart
        way = "pipeline" if how == "pipeline" else "tensor"
        assert re.search(rf"; rank 1: reloaded its own shard of model from {re.escape(str(folder))} "
                         rf"\({way} parallel, rank 1 of 2\) in \d+\.\d+ s", line), line
        assert "\n" not in line and "everything on rank 1" not in line and "lost" not in line, line
        # the tokenizer and the rest came from rank 0, the model did not (rank 0's shard is not rank 1's)
        copied = re.search(r"names restored from rank 0 \(([^)]*)\)", line)
        assert copied and "tokenizer" in copied.group(1).split(", ") and "model" not in copied.group(1).split(", "), line
        show_run(c.run(LOOK), timeout=30)
        # rank 0 kept its own model (restored, not reloaded); rank 1 reloaded its own shard
        assert c.pull("made") == [("loaded", 0, 2), ("reloaded", 1, 2)]
        assert c.restart_origins[0] == "its own names"
        assert re.fullmatch(r"from rank 0 \(\d names\) and its own shard reloaded from the folder \(model\)",
                            c.restart_origins[1]), c.restart_origins
        # both ranks' sharded layers hold MLX's new world (rank 0's restored ones too)
        assert c.pull("held_world") == [True, True]
        if how == "pipeline":
            assert c.pull("share") == [(2, 4), (0, 2)]
        show_run(c.run("after = reply()"), timeout=60)
        assert c.pull("after") == before


@pytest.mark.timeout(240)
def test_a_folder_missing_on_the_dead_ranks_host_is_one_clear_clause(folder, tmp_path):
    moved = tmp_path / "elsewhere"
    with Cluster(n=2) as c:
        show_run(c.run(LOAD["tensor"].format(folder=str(folder)) + REPLY.format(tokens=4)), timeout=120)
        with pytest.raises(DistributedCellError, match="rank 1 died"):
            show_run(c.run(KILL), timeout=30)
        folder.rename(moved)   # gone from the host (one machine: from both ranks' hosts)
        try:
            c.restart(timeout=90, quiet=True)
        finally:
            moved.rename(folder)
        line = c.last_restart
        match = re.search(rf"; rank 1: could not reload its own shard of model \({re.escape(str(folder))} is not a "
                          r"model folder on (\S+): copy the folder there, at the same path, then load the model "
                          r"again on every rank\)$", line)
        assert match and match.group(1) in ("localhost", "127.0.0.1"), line
        assert "Traceback" not in line and "\n" not in line
        show_run(c.run("has = 'model' in globals(), 'tokenizer' in globals()"), timeout=30)
        assert c.pull("has") == [(True, True), (False, True)]


@pytest.mark.timeout(300)
def test_on_two_namespace_hosts_the_dead_rank_reloads_its_own_shard(testbed, folder):
    bed = testbed
    c = Cluster(n=1, hosts=bed.ips[:2], ssh_options=bed.ssh_options(), controller_ip=f"{bed.net}.1", timeout=30)
    try:
        c.start()
        before = _load_reply_kill_restart(c, folder, "tensor")
        line = c.last_restart
        assert "restored from rank 0 over the network" in line, line
        assert re.search(rf"; rank 1: reloaded its own shard of model from {re.escape(str(folder))} "
                         r"\(tensor parallel, rank 1 of 2\) in \d+\.\d+ s", line), line
        show_run(c.run(LOOK), timeout=30)
        assert c.pull("made") == [("loaded", 0, 2), ("reloaded", 1, 2)]
        assert c.pull("held_world") == [True, True]
        show_run(c.run("after = reply()"), timeout=60)
        assert c.pull("after") == before
        # the folder gone from the dead rank's host (one file system here: gone from both)
        with pytest.raises(DistributedCellError, match="rank 1 died"):
            show_run(c.run(KILL), timeout=30)
        moved = folder.with_name("elsewhere")
        folder.rename(moved)
        try:
            c.restart(timeout=90, quiet=True)
        finally:
            moved.rename(folder)
        assert c.last_restart.endswith(f"; rank 1: could not reload its own shard of model ({folder} is not a model "
                                       f"folder on {bed.ips[1]}: copy the folder there, at the same path, then load "
                                       "the model again on every rank)"), c.last_restart
    finally:
        c.stop()


# ---------------------------------------------------------------- the parts, without a cluster


def test_a_recipe_knows_whether_its_model_still_holds_the_weights_loaded():
    import mlx.core as mx
    import mlx.nn as nn

    from mlx_jupyter.models.shard_recipe import ShardRecipe, recipe_of, restamp, stamp

    model = stamp(nn.Linear(4, 4), ShardRecipe("/m", True, False, 1, 2))
    assert recipe_of(model).describe()["changed"] is False and "_mlx_jupyter_shard" not in model   # not a child
    assert recipe_of(model).words() == "tensor parallel, rank 1 of 2"
    back = pickle.loads(pickle.dumps(model))
    assert recipe_of(back).changed is False and recipe_of(back).describe()["changed"] is True   # not stamped yet
    restamp(back)
    assert recipe_of(back).describe()["changed"] is False
    back.update({"weight": mx.zeros((4, 4))})   # trained, say: the folder no longer makes it
    assert recipe_of(back).describe()["changed"] is True
    again = pickle.loads(pickle.dumps(back))
    restamp(again)
    assert recipe_of(again).changed is True and recipe_of(again).describe()["changed"] is True


def test_the_notebook_remakes_only_models_every_live_rank_holds_as_loaded():
    recipe = {"path": "/m", "tensor": True, "pipeline": False, "size": 3, "changed": False, "rank": 0}
    saved = {0: {"shards": {"model": {**recipe, "key": 7}, "m": {**recipe, "key": 7},
                            "tuned": {**recipe, "key": 8, "changed": True}}},
             2: {"shards": {"model": {**recipe, "rank": 2, "key": 9}, "m": {**recipe, "rank": 2, "key": 9},
                            "tuned": {**recipe, "rank": 2, "key": 5}}}}
    assert held(saved) == {"model", "m", "tuned"}
    groups, lost = choose(saved)
    assert groups == [[["m", "model"], recipe]]
    assert list(lost) == ["tuned"] and "changed since they were loaded from /m" in lost["tuned"]
    result = ShardReload(lost=lost, names=["m", "model"],
                         answers={1: [{"names": ["m", "model"], "path": "/m", "seconds": 1.25,
                                       "words": "tensor parallel, rank 1 of 3"}]})
    assert result.reloaded(1) == ["m", "model"]
    words = result.clauses(1, "h2")
    assert words[0] == "rank 1: reloaded its own shard of m, model from /m (tensor parallel, rank 1 of 3) in 1.2 s"
    assert words[1].startswith("rank 1: lost tuned (its weights changed")
    assert result.clauses(1, "h2", back=["tuned"]) == words[:1]   # its own record gave it back


def test_a_function_reading_a_sharded_model_digests_alike_on_every_rank():
    """``reply()`` reads ``model``, which differs across ranks: its pickle leaves the model out (the
    namespace it comes back into holds the rank's own), so 3 live ranks agree on it and copy it."""
    import mlx.core as mx
    import mlx.nn as nn

    from mlx_jupyter.cluster.rank import keep, keep_files
    from mlx_jupyter.models.shard_recipe import ShardRecipe, stamp

    digests, names = [], []
    for rank in range(2):
        ns: dict = {"nn": nn}
        exec("def reply(x):\n    return model(x)\n", ns)
        del ns["__builtins__"]
        ns["model"] = stamp(nn.Linear(2, 2), ShardRecipe("/m", True, False, rank, 2))
        ns["model"].update({"weight": mx.full((2, 2), float(rank))})
        stamp(ns["model"], ShardRecipe("/m", True, False, rank, 2))
        name = keep_files.folder_name("shard-test", f"{rank}" * 16)
        names.append(name)
        digests.append(keep.save(name, 0, ns, digests=True)["digests"])
    try:
        assert digests[0]["reply"] == digests[1]["reply"] and digests[0]["model"] != digests[1]["model"]
        new: dict = {"model": "its own"}
        from mlx_jupyter.cluster.rank import peer_copy

        peer_copy.restore_from(names[1], 0, ["reply"], new)
        assert new["model"] == "its own" and new["reply"].__globals__ is new
    finally:
        for name in names:
            keep.discard(name, 0)


def test_a_model_sharded_with_no_recipe_is_never_copied_from_a_peer_and_the_line_says_why(folder):
    """Sharded by hand from a model no wrapped loader marked (MLX-LM's load_model): no recipe says how to
    remake a rank's part, so a dead rank gets none of it rather than a peer's part, and is told why."""
    from mlx_lm.utils import load_model

    from mlx_jupyter.cluster.rank.shard_reload import UNMADE, found

    model, _ = load_model(folder)
    whole = found({"whole": model})
    model.shard()
    shards = found({"model": model, "same": model, "_hidden": model})
    assert whole == {} and set(shards) == {"model", "same"} and shards["model"]["unmade"] == UNMADE
    saved = {0: {"shards": shards}}
    assert held(saved) == {"model", "same"}   # left out of the copy from the peers
    groups, lost = choose(saved)
    assert groups == [] and lost == {"model": UNMADE, "same": UNMADE}
