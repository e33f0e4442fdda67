"""How a loaded shard of a language model was made: its recipe, carried by the model itself.

A sharded model differs across the ranks (each holds its own part of the weights), so when a rank
dies no peer can give it its part. What can be given is how that part was made: the MLX-LM model
folder, tensor or pipeline parallel, over how many ranks. A model loaded by
:func:`mlx_jupyter.models.sharded.load_sharded`, or by ``mlx_lm.utils.sharded_load`` on a cluster's
rank (:func:`record_when_imported` wraps it there), carries a :class:`ShardRecipe` as an attribute;
a keep-state restart remakes the dead rank's own shard from it (:mod:`mlx_jupyter.cluster.rank.shard_reload`).

A recipe describes the weights as loaded: it remembers which arrays the model held then (weak
references), and a pickle of it (a restart's save) says whether the model still holds those very
arrays. A model trained, quantized or given adapters since is not remade from the folder.
"""

from __future__ import annotations

import functools
import sys
import weakref
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Optional, Union

#: the attribute of a model (an ``mlx.nn.Module``) that holds its recipe
ATTR = "_mlx_jupyter_shard"


@dataclass
class ShardRecipe:
    """This rank's shard of the model folder ``path``: ``tensor`` and/or ``pipeline`` parallel, as
    rank ``rank`` of ``size``. ``origin``: "loaded" (by the user's cell) or "reloaded" (at a restart);
    ``changed``: its weights are not (or no longer known to be) the ones loaded from the folder."""

    path: str
    tensor: bool
    pipeline: bool
    rank: int
    size: int
    trust_remote_code: bool = False
    origin: str = "loaded"
    changed: bool = False
    _model: Any = field(default=None, repr=False, compare=False)    # weakref to the model
    _leaves: Optional[list[Any]] = field(default=None, repr=False, compare=False)  # weakrefs to its arrays

    def words(self, rank: Optional[int] = None) -> str:
        """``tensor parallel, rank 1 of 2`` (``rank``: another rank's shard of the same model)."""
        how = " and ".join(w for w, on in (("tensor", self.tensor), ("pipeline", self.pipeline)) if on)
        return f"{how} parallel, rank {self.rank if rank is None else rank} of {self.size}"

    def as_loaded(self) -> bool:
        """Whether the model still holds exactly the arrays it was loaded (or restored) with."""
        model = self._model() if self._model is not None else None
        if model is None or self._leaves is None:
            return False
        leaves = _leaves(model)
        return len(leaves) == len(self._leaves) and all(ref() is a for ref, a in zip(self._leaves, leaves))

    def __getstate__(self) -> dict[str, Any]:
        state = dict(self.__dict__)
        state["changed"] = self.changed or not self.as_loaded()
        state["_model"] = state["_leaves"] = None
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)

    def describe(self) -> dict[str, Any]:
        """The recipe as plain data (JSON), for the notebook."""
        return {"path": self.path, "tensor": self.tensor, "pipeline": self.pipeline, "rank": self.rank,
                "size": self.size, "trust_remote_code": self.trust_remote_code, "origin": self.origin,
                "changed": self.changed or not self.as_loaded()}


def _leaves(model: Any) -> list[Any]:
    from mlx.utils import tree_flatten

    pairs: Any = tree_flatten(model.parameters())   # (name, array) pairs
    return [pair[1] for pair in pairs]


def stamp(model: Any, recipe: ShardRecipe) -> Any:
    """Attach ``recipe`` to ``model``, remembering the arrays it holds now; ``model``."""
    recipe._model = weakref.ref(model)
    recipe._leaves = [weakref.ref(a) for a in _leaves(model)]
    object.__setattr__(model, ATTR, recipe)   # an attribute, not a child module or parameter
    return model


def recipe_of(obj: Any) -> Optional[ShardRecipe]:
    """The recipe ``obj`` carries (None for anything else)."""
    try:
        recipe = vars(obj).get(ATTR)
    except Exception:  # noqa: BLE001 - no __dict__ (TypeError), or one that cannot be read: not a model of ours
        return None
    return recipe if isinstance(recipe, ShardRecipe) else None


def drop_shards(globals_: Optional[dict[str, Any]]) -> None:
    """Leave out of a pickled function's globals the models that carry a recipe: they differ across
    ranks, and the namespace the function is restored into has the rank's own."""
    if globals_:
        for name in [n for n, v in globals_.items() if recipe_of(v) is not None]:
            del globals_[name]


def restamp(model: Any) -> None:
    """A model just unpickled (a restart's restore) holds the arrays its pickle had: if its recipe
    said they were the loaded ones, they are again."""
    recipe = recipe_of(model)
    if recipe is not None and not recipe.changed and recipe._model is None:
        stamp(model, recipe)


def attach(model: Any, path: Union[str, Path], group: Any, tensor: bool, pipeline: bool,
           trust_remote_code: bool = False) -> Any:
    """Give a model just loaded sharded over ``group`` its recipe; ``model``."""
    folder = Path(path).expanduser()
    where = str(folder.resolve()) if folder.is_dir() else str(path)
    recipe = ShardRecipe(where, tensor, pipeline, int(group.rank()), int(group.size()), trust_remote_code)
    return stamp(model, recipe)


def _recorded(original: Callable[..., Any]) -> Callable[..., Any]:
    """``mlx_lm.utils.sharded_load``, giving the model it returns its recipe."""

    @functools.wraps(original)
    def sharded_load(repo: Any, pipeline_group: Any = None, tensor_group: Any = None, *args: Any, **kwargs: Any) -> Any:
        out = original(repo, pipeline_group, tensor_group, *args, **kwargs)
        try:
            model = out[0]
            if pipeline_group is None and tensor_group is None:   # MLX-LM's own choice, over the world
                import mlx.core as mx

                tensor = hasattr(model, "shard")
                pipeline, group = not tensor, mx.distributed.init()
            elif pipeline_group is not None and tensor_group is not None and pipeline_group is not tensor_group:
                return out   # two groups: no one recipe remakes it
            else:
                tensor, pipeline = tensor_group is not None, pipeline_group is not None
                group = tensor_group if tensor_group is not None else pipeline_group
            if recipe_of(model) is None:
                attach(model, repo, group, tensor, pipeline, bool(kwargs.get("trust_remote_code", False)))
        except Exception:  # noqa: BLE001 - the model loaded; only a later restart's reload is lost
            pass
        return out

    setattr(sharded_load, "__mlx_jupyter_recorded__", True)
    return sharded_load


#: the attribute of a model ``mlx_lm.load`` loaded whole that names its folder (a plain string: it pickles)
FOLDER_ATTR = "_mlx_jupyter_folder"


def _marked(original: Callable[..., Any]) -> Callable[..., Any]:
    """``mlx_lm.utils.load``, marking the model it returns with its folder, and making its class's ``shard``
    give it a recipe: ``model.shard()`` by hand then carries one as ``sharded_load``'s models do."""

    @functools.wraps(original)
    def load(path_or_hf_repo: Any, *args: Any, **kwargs: Any) -> Any:
        out = original(path_or_hf_repo, *args, **kwargs)
        try:
            model, folder = out[0], Path(str(path_or_hf_repo)).expanduser()
            if folder.is_dir():
                object.__setattr__(model, FOLDER_ATTR, (str(folder.resolve()), bool(kwargs.get("trust_remote_code"))))
                _wrap_shard(type(model))
        except Exception:  # noqa: BLE001 - the model loaded; only a later restart's reload is lost
            pass
        return out

    setattr(load, "__mlx_jupyter_recorded__", True)
    return load


def _wrap_shard(cls: type) -> None:
    """``cls.shard(group)`` (MLX-LM's tensor parallel, in place) gives a model marked with its folder a recipe."""
    original = cls.__dict__.get("shard")
    if original is None or getattr(original, "__mlx_jupyter_recorded__", False):
        return

    @functools.wraps(original)
    def shard(self: Any, group: Any = None, *args: Any, **kwargs: Any) -> Any:
        out = original(self, group, *args, **kwargs)
        mark = vars(self).get(FOLDER_ATTR)
        if mark is not None and recipe_of(self) is None:
            import mlx.core as mx

            attach(self, mark[0], group if group is not None else mx.distributed.init(), True, False, mark[1])
        return out

    setattr(shard, "__mlx_jupyter_recorded__", True)
    setattr(cls, "shard", shard)


def wrap(module: Any) -> None:
    """Make ``module`` (``mlx_lm.utils``)'s ``sharded_load`` give its models their recipe, and its ``load``
    mark them with their folder for a ``model.shard()`` by hand (once)."""
    for name, wrapper in (("sharded_load", _recorded), ("load", _marked)):
        original = getattr(module, name, None)
        if original is not None and not getattr(original, "__mlx_jupyter_recorded__", False):
            setattr(module, name, wrapper(original))


#: the layers of MLX's tensor parallelism (``mlx.nn.layers.distributed``): a model holding one is a shard
_SHARDED_LAYERS = ("AllToShardedLinear", "ShardedToAllLinear", "QuantizedAllToShardedLinear",
                   "QuantizedShardedToAllLinear")


def sharded_without_recipe(value: Any) -> bool:
    """Whether ``value`` is a model sharded across the ranks (tensor or pipeline parallel) that carries no
    recipe: no peer holds this rank's part, and nothing says how to remake it."""
    from mlx.nn import Module  # type: ignore[attr-defined]  # MLX's stubs leave it out

    if not isinstance(value, Module) or recipe_of(value) is not None:
        return False
    inner = getattr(value, "model", None)
    if int(getattr(inner, "pipeline_size", 1) or 1) > 1:
        return True
    return any(type(m).__name__ in _SHARDED_LAYERS for _, m in value.named_modules())


class _Finder:
    """Finds nothing itself: wraps the real loader of ``mlx_lm.utils`` to wrap ``sharded_load`` once it ran
    (before ``mlx_lm/__init__`` or a cell takes the name from it)."""

    NAME = "mlx_lm.utils"

    def find_spec(self, name: str, path: Any = None, target: Any = None) -> Any:
        if name != self.NAME:
            return None
        import importlib.util

        sys.meta_path.remove(self)
        spec = importlib.util.find_spec(name)
        if spec is None or spec.loader is None:
            return spec
        exec_module = spec.loader.exec_module

        def run(module: Any) -> None:
            exec_module(module)
            wrap(module)
        spec.loader.exec_module = run  # type: ignore[method-assign]
        return spec


def record_when_imported() -> None:
    """On a cluster's rank: models ``mlx_lm.utils.sharded_load`` loads carry their recipe."""
    if _Finder.NAME in sys.modules:
        wrap(sys.modules[_Finder.NAME])
    elif not any(isinstance(f, _Finder) for f in sys.meta_path):
        sys.meta_path.insert(0, _Finder())
