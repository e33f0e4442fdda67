"""A rank that died gets its own shard of a language model back, from the rank side: the live
ranks' models carry their recipe (:mod:`mlx_jupyter.models.shard_recipe`: the model folder, tensor
or pipeline parallel, over how many ranks), which :func:`found` reports with a restart's save, and
the dead rank's new process remakes its own shard from the folder on its host (:func:`reload`).

Remade alone: MLX-LM's ``sharded_load`` ends with a barrier over the world, which the live ranks,
restoring their own models from their saved state, never join. The shard is cut by this rank's
number in MLX's new world, and a tensor-parallel layer holds that world for its ``all_sum``, as
the live ranks' restored layers do (:mod:`.keep` gives a pickled group of every rank the new world).
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any, MutableMapping, Optional

from mlx_jupyter.models.shard_recipe import ShardRecipe, recipe_of, sharded_without_recipe, stamp


def found(ns: MutableMapping[str, Any]) -> dict[str, dict[str, Any]]:
    """The names whose value is a model carrying its recipe -> the recipe (``"key"``: the same model
    under several names has one key; ``"changed"``: not the weights loaded from the folder)."""
    out: dict[str, dict[str, Any]] = {}
    for name, value in list(ns.items()):
        if name.startswith("_"):
            continue
        recipe = recipe_of(value)
        if recipe is not None:
            out[name] = {**recipe.describe(), "key": id(value)}
        elif sharded_without_recipe(value):   # never copied from a peer (its shard is not the dead rank's)
            out[name] = {"unmade": UNMADE, "key": id(value)}
    return out


#: why a model sharded with no recipe is not given back to a dead rank
UNMADE = ("sharded by hand, with nothing that says how to remake this rank's part (a peer's part is not its "
          "own): load it again on every rank, with load_sharded, mlx_lm's sharded_load, or mlx_lm.load then "
          "model.shard()")


def _world() -> Any:
    from mlx_jupyter.cluster.rank.names import NAMES

    return NAMES.world


def remake(recipe: dict[str, Any], group: Any) -> Any:
    """This rank's shard over ``group`` of the model folder ``recipe`` names, without a collective."""
    import mlx.core as mx
    from mlx_lm.utils import load_model

    model, _ = load_model(Path(recipe["path"]), lazy=True, strict=False,
                          trust_remote_code=bool(recipe.get("trust_remote_code")))
    if recipe["tensor"]:
        model.shard(group)
    if recipe["pipeline"]:
        model.model.pipeline(group)
    mx.eval(model.parameters())
    made = ShardRecipe(str(recipe["path"]), bool(recipe["tensor"]), bool(recipe["pipeline"]), int(group.rank()),
                       int(group.size()), bool(recipe.get("trust_remote_code")), origin="reloaded")
    return stamp(model, made)


def reload(shards: list[list[Any]], ns: Optional[MutableMapping[str, Any]] = None) -> list[dict[str, Any]]:
    """Each ``[names, recipe]`` of ``shards``: remake this rank's own shard and bind it to ``names``;
    per shard, what happened: ``seconds`` and ``words`` (``tensor parallel, rank 1 of 2``), else
    ``missing`` (the folder is not on this host) or ``error`` (one line)."""
    from mlx_jupyter.cluster.rank import agent as _agent

    if ns is None:
        ns = _agent.AGENT.shell.user_ns if _agent.AGENT is not None else {}
    out = []
    for names, recipe in shards:
        entry: dict[str, Any] = {"names": list(names), "path": recipe["path"]}
        out.append(entry)
        folder = Path(recipe["path"])
        if not (folder / "config.json").is_file():
            entry["missing"] = True
            continue
        group = _world()
        if group is None:
            entry["error"] = "MLX's new world did not form on this rank"
            continue
        if int(group.size()) != int(recipe["size"]):
            entry["error"] = f"it was sharded over {recipe['size']} ranks, MLX's new world has {group.size()}"
            continue
        start = time.monotonic()
        try:
            model = remake(recipe, group)
        except Exception as exc:  # noqa: BLE001 - costs only this model, said in one line
            text = (str(exc).strip().splitlines() or [""])[0][:160]
            entry["error"] = f"{type(exc).__name__}: {text}" if text else type(exc).__name__
            continue
        for name in names:
            ns[name] = model
        made = recipe_of(model)
        entry["seconds"] = round(time.monotonic() - start, 3)
        entry["words"] = made.words() if made is not None else ""
    return out
