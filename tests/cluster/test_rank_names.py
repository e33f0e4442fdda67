"""Which names the product defines on the ranks, and when it forms `group` again: one policy for
``Cluster.run`` from plain Python and for ``%%mlx_distributed`` (a real kernel), never rebinding a
name the user bound, and forming again only what an abort actually broke."""

from __future__ import annotations

import ast
import json
import time

import pytest

from mlx_jupyter.cluster import Cluster
from mlx_jupyter.cluster.cells.display import DistributedCellError, show_run
from mlx_jupyter.cluster.rank.names import ProductNames, WorldClosedError, WorldGuard, uses_mlx_world
from tests.cluster.kernel import Kernel

pytestmark = pytest.mark.timeout(150)


# ---------------------------------------------------------------- the rule, alone


def test_a_name_is_bound_only_where_it_is_free_or_still_the_products():
    names, ns = ProductNames(), {}
    ours, theirs, again = object(), object(), object()
    assert names.bind(ns, "group", ours) and ns["group"] is ours
    assert names.bind(ns, "group", again) and ns["group"] is again  # still ours: rebound
    ns["group"] = theirs                                              # the user's own
    assert not names.bind(ns, "group", ours) and ns["group"] is theirs
    del ns["group"]                                                   # freed by the user
    assert names.bind(ns, "group", ours) and ns["group"] is ours


def test_an_equal_object_is_not_the_products():
    """Identity, not equality: a user's list equal to ours is still the user's."""
    names, ns = ProductNames(), {}
    names.bind(ns, "world", [1])
    ns["world"] = [1]
    assert not names.owns(ns, "world") and not names.bind(ns, "world", [2])


def test_what_counts_as_using_mlxs_world():
    import mlx.core as mx

    ns = {"mx": mx, "g": mx.distributed.init(), "f": mx.distributed.all_sum, "n": 3}
    used = ["world.rank()", "mx.distributed.all_sum(x)", "y = mx.distributed", "g.size()", "f(x)"]
    unused = ["n + 1", "import numpy as np\nnp.ones(2)", "group.rank()", "d.all_sum(x)"]
    assert all(uses_mlx_world(ast.parse(code), ns) for code in used)
    assert not any(uses_mlx_world(ast.parse(code), ns) for code in unused)


def test_a_cell_using_a_dead_world_is_refused_with_one_line():
    names = ProductNames()
    guard = WorldGuard({}, names)
    tree = ast.parse("world.rank()")
    assert guard.visit(tree) is tree  # alive: untouched
    names.world_is_dead("shut down on rank 0 after: rank 1 raised ZeroDivisionError", "restart the ranks: x()")
    with pytest.raises(WorldClosedError) as err:
        guard.visit(tree)
    assert err.value._render_traceback_() == [
        "WorldClosedError: MLX's `world` is shut down (shut down on rank 0 after: rank 1 raised ZeroDivisionError), "
        "so this cell, which uses it, did not run; restart the ranks: x()"]
    assert guard.visit(ast.parse("n = 1")) is not None  # a cell not using it still runs


# ---------------------------------------------------------------- the same cells, both ways in

#: (how, code): "interrupt" cells print ARMED on every rank, then are stopped (the stop button)
CELLS = [
    ("run", "group = mx.distributed.init(backend='ring', strict=True)"),  # the usual MLX idiom: the user's `group`
    ("interrupt", "print('ARMED', flush=True)\nwhile True: pass"),           # no collective involved
    ("run", "x = mx.distributed.all_sum(mx.ones(2), group=group).tolist()"),  # the user's object still works
    ("run", "if world.rank() == 1:\n    raise ValueError('only rank 1')"),   # nobody blocked in an op
    ("run", "z = ("),                                                         # a SyntaxError on every rank
    ("run", "import numpy as np, mlx_jupyter.distributed as d"),
    ("interrupt", "print('ARMED', flush=True)\nd.recv(3, 'float64', src=1 - world.rank())"),  # inside our op
    ("run", "y = mx.distributed.all_sum(mx.ones(2) * 2, group=group).tolist()"),  # re-formed ours, kept theirs
    ("run", "del group"),                                                     # `group` free again
    ("interrupt", "print('ARMED', flush=True)\nd.recv(3, 'float64', src=1 - world.rank())"),
    ("run", "s = d.all_sum(np.ones(2)).tolist()\n"
            "kinds = {n: type(globals()[n]).__name__ for n in ('mx', 'world', 'group')}"),
]
STATUS = ["ok", "error", "ok", "error", "error", "ok", "error", "ok", "ok", "error", "ok"]
PULLED = ("x", "y", "s", "kinds")
KEPT = ("mlx-jupyter: our core's group was aborted; re-formed it on ranks 0-1; your own `group` is left as it is "
        "on ranks 0-1")
REFORMED = "mlx-jupyter: our core's group was aborted; re-formed it as `group` on ranks 0-1"


def through_cluster_run(capsys) -> tuple[list[str], list[str], dict]:
    """Each cell's status and output through ``Cluster.run`` from plain Python; the pulled values."""
    statuses, outputs = [], []
    with Cluster(n=2) as c:
        for how, code in CELLS:
            r = c.run(code)
            if how == "interrupt":  # once both ranks are inside the cell: the stop button
                seen, armed = [], set()
                while len(armed) < 2:
                    ev = r.next_event(10)
                    assert ev is not None, armed
                    seen.append(ev)
                    if ev.kind == "stream" and "ARMED" in ev.payload[1]:
                        armed.add(ev.rank)
                r.interrupt()
                for ev in seen:  # shown below, as a notebook would
                    r.events.put(ev)
            try:
                show_run(r, timeout=30)
                statuses.append("ok")
            except DistributedCellError:
                statuses.append("error")
            outputs.append(capsys.readouterr().out)
        pulled = {name: c.pull(name) for name in PULLED}
    return statuses, outputs, pulled


def through_the_magic() -> tuple[list[str], list[str], dict]:
    """The same cells as ``%%mlx_distributed`` in a real kernel."""
    k = Kernel()
    statuses, outputs = [], []
    try:
        assert k.run("%load_ext mlx_jupyter\n%mlx_cluster start -n 2", 60).status == "ok"
        for how, code in CELLS:
            armed: dict = {}

            def on_output(name, text, armed=armed):
                armed["n"] = armed.get("n", 0) + text.count("ARMED")
                if how == "interrupt" and "t" not in armed and (armed["n"] >= 2 or "ranks 0-1" in text):
                    armed["t"] = time.monotonic()
                    k.interrupt()

            res = k.collect(k.submit(f"%%mlx_distributed\n{code}"), 30, on_output)
            statuses.append(res.status)
            outputs.append(res.stdout)
        res = k.run("import json\n_r = {n: get_ipython().run_line_magic('mlx_pull', n) for n in "
                    f"{PULLED!r}}}\nprint('PULLED', json.dumps(_r))", 30)
        assert res.status == "ok", res
        pulled = json.loads(res.stdout.split("PULLED", 1)[1])
        assert k.run("%mlx_cluster stop", 30).status == "ok"
    finally:
        k.close()
    return statuses, outputs, pulled


def test_the_same_cells_leave_the_same_names_through_cluster_run_and_the_magic(capsys):
    ours = through_cluster_run(capsys)
    magic = through_the_magic()
    for statuses, outputs, pulled in (ours, magic):
        assert statuses == STATUS, (statuses, outputs)
        assert pulled["x"] == [[2.0, 2.0]] * 2 and pulled["y"] == [[4.0, 4.0]] * 2, pulled  # the user's group
        assert pulled["s"] == [[2.0, 2.0]] * 2, pulled
        assert pulled["kinds"] == [{"mx": "module", "world": "Group", "group": "CoreGroup"}] * 2, pulled
        # one line each time, and only after an interrupt inside our op: the other failures broke nothing
        said = [i for i, out in enumerate(outputs) if "re-formed" in out]
        assert said == [7, 10], outputs
        assert KEPT in outputs[7] and REFORMED in outputs[10], outputs
    assert ours[0] == magic[0] and ours[2] == magic[2]


def test_after_mlxs_world_died_a_cell_using_it_fails_with_one_line_that_offers_cluster_restart(capsys):
    """Rank 1 raises having built another collective #1 than the all_sum rank 0 waits in on the user's
    `group` (MLX's world): no drain can make that call (issue 42), so the release shuts the world down (MLX cannot form it
    again in that process). The error offers what works from plain Python, and the next cell that
    uses it fails with one line, without MLX's socket noise; a cell not using it runs;
    ``cluster.restart()`` gives a working world."""
    with Cluster(n=2) as c:
        assert c.run("group = mx.distributed.init(backend='ring', strict=True)").wait(30)
        with pytest.raises(DistributedCellError) as err:
            # both ranks pass our core's barrier; then rank 1 raises while rank 0 goes into MLX's all_sum
            show_run(c.run("import mlx_jupyter.distributed as d\nd.init().barrier()\n"
                           "if world.rank() == 1:\n    g = mx.distributed.all_gather(mx.ones(5), group=group)\n    1/0\n"
                           "mx.eval(mx.distributed.all_sum(mx.ones(3), group=group))"),
                     timeout=30)
        assert "For a new `world`, restart the ranks: cluster.restart()" in "\n".join(err.value.lines)
        capsys.readouterr()
        with pytest.raises(DistributedCellError) as err:
            show_run(c.run("y = mx.distributed.all_sum(mx.ones(2), group=group)\nmx.eval(y)"), timeout=30)
        assert str(err.value).startswith("MLX's `world` is shut down (shut down on rank 0 after: rank 1 raised "
                                         "ZeroDivisionError"), err.value
        assert str(err.value).endswith("so this cell, which uses it, did not run; restart the ranks: cluster.restart() "
                                       "(it keeps the ranks' names)")
        assert err.value.lines == []
        shown = capsys.readouterr()
        assert "[ring]" not in shown.out + shown.err, shown
        assert c.run("n = 1").wait(30) and c.pull("n") == [1, 1]
        c.restart(timeout=60)
        show_run(c.run("y = mx.distributed.all_sum(mx.ones(2), group=world).tolist()"), timeout=30)
        assert c.pull("y") == [[2.0, 2.0]] * 2
