"""A rank's user variables across a restart: saved by the old rank into a host-local file, read
back by the new rank of the same number on the same host.

Arrays (numpy, MLX including bfloat16, torch CPU) travel as raw bytes: pickle protocol 5 with
out-of-band buffers written straight to the data file, read back through an ``mmap`` of it (no
copy of a numpy array's data, one copy into MLX or torch). Everything else goes through
cloudpickle, one name at a time, so that one name that cannot be kept costs only itself. MLX's
world and our core's group (any group of every rank) come back as the new rank's: a user's
``group = mx.distributed.init()``, or a function or model holding it, keeps working.
"""

from __future__ import annotations

import io
import mmap
import pickle
import socket
import sys
import types
from typing import Any, Callable, MutableMapping, Optional

import cloudpickle

from mlx_jupyter.cluster.rank.keep_files import (folders_here, keep_dir, keep_root, keep_roots, private_dir,
                                                 rank_folder, remove_all)
from mlx_jupyter.cluster.rank.keep_write import NoRoom, SavedFiles, discard_in
from mlx_jupyter.cluster.rank.names import NAMES, PRODUCT_NAMES

__all__ = ["save", "restore", "discard", "remove_all", "keep_root", "keep_dir", "NotKept", "NoRoom"]

#: IPython's own names in a user namespace, never kept
IPYTHON_NAMES = frozenset({"In", "Out", "get_ipython", "exit", "quit", "__builtins__", "__builtin__", "__name__",
                           "__doc__", "__package__", "__loader__", "__spec__"})


class NotKept(Exception):
    """A value that cannot outlive its rank (it holds a split group or a socket)."""


def is_internal(name: str) -> bool:
    """IPython's history and output names (``_``, ``__``, ``_i3``, ``_7``...) and its helpers."""
    return name in IPYTHON_NAMES or name.startswith("_")


def _group_kind(obj: Any) -> Optional[str]:
    """"world" for an MLX group, "group" for one of our core's, else None."""
    kind = type(obj)
    module = getattr(kind, "__module__", "") or ""
    if module.startswith("mlx.core") and kind.__name__ == "Group":
        return "world"
    if module.startswith("mlx_jupyter") and "Group" in kind.__name__ and hasattr(obj, "size"):
        return "group"
    return None


def _of_every_rank(obj: Any) -> bool:
    """A group of all the ranks: it comes back as the new rank's (MLX's world, our core's group)."""
    from mlx_jupyter.cluster.rank.world import this_rank_env

    try:
        return int(obj.size()) == this_rank_env().size
    except Exception:  # noqa: BLE001 - a group that cannot say: not kept
        return False


def _unkeepable(obj: Any) -> Optional[str]:
    """Why ``obj`` cannot be kept, for the kinds that hold the old processes' resources."""
    kind = _group_kind(obj)
    if kind == "world":
        return "holds an MLX group split from the old world: split the new `world` again"
    if kind == "group":
        return "holds a group split from the old core group: split the new `group` again"
    if isinstance(obj, socket.socket):
        return "a socket"
    if isinstance(obj, types.GeneratorType):
        return "a generator: cannot be pickled"
    if type(obj).__module__ == "mlx.core" and type(obj).__name__ == "_gc_func":
        # pickled, it would come back as the plain function, without its transform
        return "an MLX transform (mx.grad, mx.value_and_grad, mx.compile...): make it again"
    return None


def _is_nn_value_and_grad(fn: types.FunctionType) -> bool:
    """Whether ``fn`` is what ``mlx.nn.value_and_grad(model, f)`` made (it comes back made again)."""
    code = fn.__code__
    return (code.co_name == "wrapped_value_grad_fn" and code.co_filename.replace("\\", "/").endswith("mlx/nn/utils.py")
            and "model" in code.co_freevars and hasattr(fn, "__wrapped__"))


def _rebuild_value_and_grad(model: Any, fn: Any) -> Any:
    from mlx.nn.utils import value_and_grad   # mlx.nn's, defined there

    return value_and_grad(model, fn)


def _new_group(kind: str) -> Any:
    """The new rank's MLX world (``kind`` "world") or core group ("group"), for an old one of every rank."""
    value = NAMES.world if kind == "world" else NAMES.group
    if value is None:
        raise NotKept(f"the new {'MLX world' if kind == 'world' else 'core group'} did not form on this rank")
    return value


#: addresses of saved buffers not to copy into MLX (only names a dead rank does not take hold them: peer_copy)
SKIP: set[int] = set()


def buffer_address(buf: Any) -> int:
    """Where a (non-empty) buffer's bytes are in memory."""
    import numpy as np

    return int(np.frombuffer(buf, dtype=np.uint8).__array_interface__["data"][0])


def _rebuild_mlx(buf: Any, dtype: str, shape: tuple[int, ...], view: Optional[str]) -> Any:
    import mlx.core as mx
    import numpy as np

    if SKIP and len(memoryview(buf).cast("B")) and buffer_address(buf) in SKIP:
        return None

    data = np.frombuffer(buf, dtype=np.dtype(view or dtype)).reshape(shape)
    arr = mx.array(data)
    return arr.view(getattr(mx, dtype)) if view else arr


def _rebuild_torch(buf: Any, dtype: str, shape: tuple[int, ...], view: Optional[str], requires_grad: bool) -> Any:
    import numpy as np
    import torch

    data = np.frombuffer(buf, dtype=np.dtype(view or dtype)).reshape(shape)
    t = torch.from_numpy(data)
    if view:
        t = t.view(getattr(torch, dtype))
    return t.requires_grad_(requires_grad) if requires_grad else t


#: dtypes numpy lacks, carried as an integer of the same width
_NUMPY_LACKS = {"bfloat16": "uint16"}


def _mlx_reduce(arr: Any) -> tuple[Callable[..., Any], tuple[Any, ...]]:
    import numpy as np

    dtype = str(arr.dtype).rsplit(".", 1)[-1]
    view = _NUMPY_LACKS.get(dtype)
    raw = arr.view(getattr(sys.modules["mlx.core"], view)) if view else arr
    data = np.ascontiguousarray(np.asarray(raw))
    return _rebuild_mlx, (pickle.PickleBuffer(data), dtype, tuple(arr.shape), view)  # type: ignore[arg-type]  # numpy's stubs: no __buffer__


def _torch_reduce(t: Any) -> Any:
    import torch

    if t.device.type != "cpu" or t.is_sparse or t.is_quantized:
        return NotImplemented
    dtype = str(t.dtype).rsplit(".", 1)[-1]
    view = _NUMPY_LACKS.get(dtype)
    plain = t.detach().contiguous()
    view = "int16" if view else None  # torch reads no uint16 from numpy
    data = plain.view(torch.int16).numpy() if view else plain.numpy()
    return _rebuild_torch, (pickle.PickleBuffer(data), dtype, tuple(t.shape), view, bool(t.requires_grad))


class _Pickler(cloudpickle.CloudPickler):  # type: ignore[misc]  # cloudpickle ships no types
    """cloudpickle, with MLX arrays and torch CPU tensors as out-of-band buffers, and a clear
    refusal for what holds the old processes' resources."""

    #: the kinds of group ("world", "group") met, each to be replaced by the new rank's
    renewed: set[str]

    def reducer_override(self, obj: Any) -> Any:
        kind = _group_kind(obj)
        if kind is not None and _of_every_rank(obj):
            self.renewed.add(kind)
            return _new_group, (kind,)
        why = _unkeepable(obj)
        if why:
            raise NotKept(why)
        module = type(obj).__module__ or ""
        if module.startswith("mlx.core") and type(obj).__name__ == "array":
            return _mlx_reduce(obj)
        if isinstance(obj, types.FunctionType) and _is_nn_value_and_grad(obj):
            closure = dict(zip(obj.__code__.co_freevars, (c.cell_contents for c in obj.__closure__ or ())))
            return _rebuild_value_and_grad, (closure["model"], getattr(obj, "__wrapped__"))  # functools.wraps set it
        if module == "torch" and type(obj).__name__ in ("Tensor", "Parameter"):
            if type(obj).__name__ == "Tensor":
                reduced = _torch_reduce(obj)
                if reduced is not NotImplemented:
                    return reduced
        return super().reducer_override(obj)

    def _dynamic_function_reduce(self, func: Any) -> Any:
        """A cell's function without the sharded models among the globals it reads (the namespace it
        comes back into holds the rank's own), so that ``reply()`` reading ``model`` pickles alike on every rank."""
        reduced = super()._dynamic_function_reduce(func)
        if isinstance(self.globals_ref.get(id(func.__globals__)), _UserGlobals):
            from mlx_jupyter.models.shard_recipe import drop_shards

            drop_shards(reduced[2][1].get("__globals__"))
        return reduced


class _UserGlobals(dict[str, Any]):
    """Stands for the user's namespace as the globals of the functions defined in it: they are
    rebuilt with the new rank's namespace as their globals, as if defined there."""

    def __reduce__(self) -> tuple[Callable[[], Any], tuple[()]]:
        return _target_namespace, ()


#: the namespace being restored into (set by :func:`restore` while it unpickles)
_TARGET: dict[str, Any] = {}


def _target_namespace() -> Any:
    return _TARGET["ns"]


def _dumps(value: Any, ns: MutableMapping[str, Any], buffer_callback: Any, renewed: Optional[set[str]] = None) -> bytes:
    """``value`` pickled; ``renewed`` gets the kinds of group in it that the new rank's replace."""
    out = io.BytesIO()
    pickler = _Pickler(out, protocol=5, buffer_callback=buffer_callback)
    pickler.renewed = renewed if renewed is not None else set()
    pickler.globals_ref[id(ns)] = _UserGlobals(__name__="__main__")
    pickler.dump(value)
    return out.getvalue()


def _reason(value: Any, exc: BaseException) -> str:
    if isinstance(exc, NotKept):
        return str(exc)
    why = _unkeepable(value)
    if why:
        return why
    text = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
    return f"{type(value).__name__}: {text[:80]}"


def save(dirname: str, rank: int, ns: Optional[MutableMapping[str, Any]] = None,
         hidden: Optional[MutableMapping[str, Any]] = None, digests: bool = False) -> dict[str, Any]:
    """Save this rank's user names into ``<keep_root>/<dirname>/rank<r>.*``; what was saved and not.
    ``hidden``: what IPython itself put in the namespace (its ``open``...), left out while unchanged;
    ``digests``: also a digest per saved name (its pickle and its arrays' bytes), to compare across ranks."""
    if ns is None:
        from mlx_jupyter.cluster.rank import agent as _agent

        shell = _agent.AGENT.shell if _agent.AGENT is not None else None
        ns = shell.user_ns if shell is not None else {}
        hidden = getattr(shell, "user_ns_hidden", None)
    hidden = hidden or {}
    folder = private_dir(keep_dir(dirname), create=True)
    modules: dict[str, str] = {}
    not_kept: dict[str, str] = {}
    singles: dict[str, tuple[bytes, list[pickle.PickleBuffer]]] = {}
    needs: set[str] = set()      # the new groups the restore needs formed first
    renewed: dict[str, str] = {}  # name -> "world" / "group": it is the old one, and will be the new one
    for name, value in list(ns.items()):
        if is_internal(name) or (name in PRODUCT_NAMES and NAMES.owns(ns, name)):
            continue
        if name in hidden and hidden[name] is value:
            continue
        if isinstance(value, types.ModuleType):
            modules[name] = value.__name__
            continue
        found: list[pickle.PickleBuffer] = []
        kinds: set[str] = set()
        try:
            singles[name] = (_dumps(value, ns, found.append, kinds), found)
            needs |= kinds
            kind = _group_kind(value)
            if kind in kinds:
                renewed[name] = kind
        except BaseException as exc:  # noqa: BLE001 - any failure only means: not kept
            if isinstance(exc, KeyboardInterrupt):
                raise
            not_kept[name] = _reason(value, exc)
    # all names in one pickle, so that what they share stays shared (a function and the optimizer
    # it updates); each name alone as well, for a restore that fails on one of them
    together: list[pickle.PickleBuffer] = []
    try:
        whole: Optional[bytes] = _dumps({name: ns[name] for name in singles}, ns, together.append)
    except Exception:  # noqa: BLE001 - then the names come back one by one
        whole, together = None, []
    files = SavedFiles(whole, together, singles, modules)
    nbytes = files.write_somewhere(dirname, rank)
    others = [n for n in folders_here() if n != dirname]   # the notebook tells which are stale
    answer = {"kept": list(singles) + list(modules), "not_kept": not_kept, "bytes": nbytes,
              "folder": str(files.folder), "others": others, "needs": sorted(needs), "renewed": renewed,
              "modules": modules}
    if digests:
        ids = _class_ids()
        answer["digests"] = {name: digest(payload, found, ids) for name, (payload, found) in singles.items()}
    return answer


def _class_ids() -> list[bytes]:
    """The random ids cloudpickle gives the classes defined in cells (a rank's own, unlike the
    class): left out of a digest, so that one model class on two ranks digests alike."""
    tracker = getattr(cloudpickle.cloudpickle, "_DYNAMIC_CLASS_TRACKER_BY_ID", None)
    try:
        return [i.encode() for i in list(tracker or ()) if isinstance(i, str) and i]
    except RuntimeError:   # changed while listed (another thread made a class): compare as they are
        return []


def digest(payload: bytes, buffers: list[pickle.PickleBuffer], class_ids: Optional[list[bytes]] = None) -> str:
    """One saved name's digest: its pickle (without ``class_ids``) and the bytes of each array in
    it (equal on two ranks exactly when the pickles and the arrays' bytes are)."""
    import hashlib

    for cid in class_ids or ():
        if cid in payload:
            payload = payload.replace(cid, b"0" * len(cid))
    h = hashlib.sha1(payload, usedforsecurity=False)   # equality of our own ranks' data: the fastest here
    for buf in buffers:
        raw = buf.raw()
        h.update(len(raw).to_bytes(8, "little"))
        h.update(raw)
    return h.hexdigest()


def restore(dirname: str, rank: int, ns: Optional[MutableMapping[str, Any]] = None, discard_files: bool = True) -> dict[str, Any]:
    """Bind the names rank ``rank`` saved into this rank's namespace; then remove its files (unless
    ``discard_files`` is False: a dead rank's new process reads them at the same time, :mod:`.peer_copy`)."""
    if ns is None:
        ns = _user_ns()
    folder = private_dir(rank_folder(dirname, rank), create=False)
    index_path, data_path = folder / f"rank{rank}.index", folder / f"rank{rank}.data"
    try:
        with open(index_path, "rb") as f:
            index = pickle.load(f)
        back = import_modules(index["modules"], ns, overwrite=True)
        restored, failed = back["restored"], back["failed"]
        mapped = None
        if data_path.stat().st_size:
            with open(data_path, "rb") as f:
                mapped = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_COPY)
        view = memoryview(mapped) if mapped is not None else memoryview(b"")
        _TARGET["ns"] = ns
        try:
            whole, whole_spans = index["whole"]
            values = pickle.loads(whole, buffers=[view[o:o + n] for o, n in whole_spans])
            ns.update(values)
            restored.extend(values)
        except Exception:  # noqa: BLE001 - then name by name: one name's failure costs only that name
            for name, payload, spans in index["records"]:
                try:
                    ns[name] = pickle.loads(payload, buffers=[view[o:o + n] for o, n in spans])
                    restored.append(name)
                except Exception as exc:  # noqa: BLE001
                    failed[name] = f"could not be restored: {type(exc).__name__}: {str(exc)[:80]}"
        finally:
            _TARGET.pop("ns", None)
        from mlx_jupyter.models.shard_recipe import restamp

        for name in restored:   # a sharded model's recipe knows its restored weights as the loaded ones
            restamp(ns.get(name))
    finally:
        if discard_files:
            discard(dirname, rank)
    return {"restored": restored, "failed": failed}


def _user_ns() -> MutableMapping[str, Any]:
    """This rank's user namespace (the engine's shell's; an empty dict outside an engine)."""
    from mlx_jupyter.cluster.rank import agent as _agent

    return _agent.AGENT.shell.user_ns if _agent.AGENT is not None else {}


def import_modules(modules: dict[str, str], ns: Optional[MutableMapping[str, Any]] = None,
                   overwrite: bool = False) -> dict[str, Any]:
    """Bind each name to its module (``np`` -> numpy): a rank's own saved imports (:func:`restore`,
    ``overwrite``), or, for a rank that kept nothing, the other ranks' imports, which are the same
    everywhere (names it has bound already stay); what came back and what did not."""
    import importlib

    if ns is None:
        ns = _user_ns()
    restored, failed = [], {}
    for name, module in modules.items():
        if name in ns and not overwrite:
            continue
        try:
            ns[name] = importlib.import_module(module)
            restored.append(name)
        except Exception as exc:  # noqa: BLE001
            failed[name] = f"module {module} did not import again: {exc}"
    return {"restored": restored, "failed": failed}


def discard(dirname: str, rank: int) -> None:
    """Remove rank ``rank``'s files, and the folder once it is empty (mapped data stays readable)."""
    for root in keep_roots():
        discard_in(keep_dir(dirname, root), rank)
