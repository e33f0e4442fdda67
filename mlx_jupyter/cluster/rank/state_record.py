"""A rank's own state, recorded after each cell that ends cleanly (opt-in: ``record_state``), so
that a rank that dies comes back on restart with its names as of its last finished cell, even
those that differ across ranks (a data shard, an RNG state), which its peers cannot give.

At a cell's clean end the agent calls :func:`cell_ended`: one look at the namespace on the main
thread (which names, no copy), handed to a background thread that records what changed since the
last record into this host's keep folder (:mod:`.keep_files`): each name's pickle (as
:mod:`.keep` makes it, arrays out of band) in the record's index, each array's bytes in a file
named after their digest, so an unchanged array costs one hash and no write. The index is replaced
whole (write, then rename), so a rank killed while it records leaves the previous record intact.
A record is made only while the rank is idle: if a cell begins meanwhile, the record is given up
(its names may change under it) and the previous one stays; the next clean cell's end records
again. So the record never competes with a cell for the GIL, beyond one name's pickle, and a rank
running cells back to back is recorded once they stop.
"""

from __future__ import annotations

import hashlib
import os
import pickle
import sys
import threading
import time
from pathlib import Path
from typing import Any, Callable, Optional

from mlx_jupyter.cluster.rank import cell_end

#: this rank's recorder while recording is on
RECORDER: Optional["Recorder"] = None
#: seconds a rank stays idle after a clean cell before its record begins (a cell sent right after
#: it meets no record holding the GIL)
IDLE = 0.2
#: bytes hashed or written per step (the GIL is released inside each)
_CHUNK = 64 << 20


class _GivenUp(Exception):
    """A cell began while a record was being made: it is given up."""


def _hash(raw: memoryview, stop: Optional[Callable[[], bool]] = None) -> str:
    flat = raw.cast("B") if raw.format != "B" or raw.ndim != 1 else raw
    h = hashlib.sha1(usedforsecurity=False)
    for start in range(0, flat.nbytes, _CHUNK):
        if stop is not None and start and stop():
            raise _GivenUp
        h.update(flat[start:start + _CHUNK])
    return f"{h.hexdigest()}-{flat.nbytes}"


class Recorder:
    """Records rank ``rank``'s names into ``folder`` after each clean cell (see the module docstring)."""

    def __init__(self, folder: Path, rank: int, ns: Any, hidden: Any, cell_count: Callable[[], int]) -> None:
        self.folder, self.rank, self.ns, self.hidden = folder, rank, ns, hidden or {}
        self.cell_count = cell_count   # the agent's count of requests begun: tells a cell that ran meanwhile
        self.index_path = folder / f"rank{rank}.record"
        self.cell: Optional[int] = None      # the notebook's number of the cell last recorded
        self.blobs: set[str] = set()         # digests whose files exist
        self.names: list[str] = []
        self.seconds = 0.0                   # the last record's time (background)
        self.written = 0                     # bytes the last record wrote
        self.skipped = 0                     # records given up because a cell began meanwhile
        self.error = ""
        self.recorded_at = 0.0               # wall clock of the last record
        self._stream: Any = None             # the record thread's MLX stream
        self._cache: dict[str, tuple[Any, bytes, list[str]]] = {}   # name -> (function or class, its pickle, digests)
        self._evaluated: dict[str, Any] = {}   # name -> the MLX array evaluated at the last cell's end
        self._load()
        self._slot: Optional[tuple[int, dict[str, Any], int]] = None
        self._cv = threading.Condition()
        self._busy = False
        self._stop = False
        self._thread = threading.Thread(target=self._loop, name="mlx-state-record", daemon=True)
        self._thread.start()

    def _load(self) -> None:
        """What an earlier process of this rank recorded (a restarted rank records on from it)."""
        try:
            with open(self.index_path, "rb") as f:
                index = pickle.load(f)
            self.cell, self.recorded_at = index.get("cell"), index.get("time", 0.0)
            self.names = list(index["records"]) + list(index["modules"])
        except (OSError, pickle.UnpicklingError, EOFError, KeyError, TypeError):
            pass
        prefix = f"rank{self.rank}-"
        try:
            self.blobs = {p.name[len(prefix):-5] for p in self.folder.iterdir()
                          if p.name.startswith(prefix) and p.name.endswith(".blob")}
        except OSError:
            self.blobs = set()

    # ------------------------------------------------------------ the cell's end (main thread: cheap)

    def cell_ended(self, number: int) -> None:
        """Hand the names bound now to the background thread (the latest cell wins)."""
        from mlx_jupyter.cluster.rank.keep import is_internal
        from mlx_jupyter.cluster.rank.names import NAMES, PRODUCT_NAMES

        ns, hidden = self.ns, self.hidden
        names = {n: v for n, v in list(ns.items())
                 if not is_internal(n) and not (n in PRODUCT_NAMES and NAMES.owns(ns, n))
                 and not (n in hidden and hidden[n] is v)}
        mx = sys.modules.get("mlx.core")
        if mx is not None:   # a lazy MLX array can be evaluated only on the thread whose stream built it
            arrays = {n: v for n, v in names.items() if isinstance(v, mx.array)}
            new = [v for n, v in arrays.items() if self._evaluated.get(n) is not v]
            if new:
                mx.eval(*new)   # what the cell left lazy (the arrays seen at the last cell's end were evaluated then)
            self._evaluated = arrays
        with self._cv:
            self._slot = (number, names, self.cell_count())
            self._cv.notify()

    # ------------------------------------------------------------ the background thread

    def _loop(self) -> None:
        while True:
            with self._cv:
                self._cv.wait_for(lambda: self._slot is not None or self._stop)
                if self._stop:
                    return
                slot, self._slot = self._slot, None
                self._busy = True
            try:
                time.sleep(IDLE)   # cells back to back: record once they pause (a new slot replaces this one)
                if self.cell_count() != slot[2]:   # type: ignore[index]
                    continue
                with self._mlx_stream():
                    self._record(*slot)   # type: ignore[misc]
            except Exception as exc:  # noqa: BLE001 - a record that fails costs only itself
                self.error = f"{type(exc).__name__}: {exc}"
            finally:
                with self._cv:
                    self._busy = False
                    self._cv.notify_all()

    def _mlx_stream(self) -> Any:
        """A stream of this thread's own for MLX (a bfloat16 array's view is an op), once MLX is loaded."""
        import contextlib

        mx = sys.modules.get("mlx.core")
        if mx is None:
            return contextlib.nullcontext()
        if self._stream is None:
            self._stream = mx.new_stream(mx.cpu)
        return mx.stream(self._stream)

    def _record(self, number: int, names: dict[str, Any], began: int) -> None:
        import types

        from mlx_jupyter.cluster.rank import keep

        t0 = time.perf_counter()
        records: dict[str, tuple[bytes, list[str]]] = {}
        modules: dict[str, str] = {}
        not_kept: dict[str, str] = {}
        written = 0
        cache: dict[str, tuple[Any, bytes, list[str]]] = {}

        def moved() -> bool:
            """A cell began since: the names may have changed under us; this record is given up."""
            if self.cell_count() != began:
                self.skipped += 1
                return True
            return False

        for name, value in names.items():
            if moved():
                return
            if isinstance(value, types.ModuleType):
                modules[name] = value.__name__
                continue
            known = self._cache.get(name)
            if known is not None and known[0] is value:   # the same function or class as last time
                records[name], cache[name] = (known[1], known[2]), known
                continue
            found: list[pickle.PickleBuffer] = []
            try:
                payload = keep._dumps(value, self.ns, found.append)
            except Exception as exc:  # noqa: BLE001 - not recordable (a socket, a generator...)
                not_kept[name] = keep._reason(value, exc)
                continue
            digests = []
            for buf in found:
                if moved():
                    return
                raw = buf.raw()
                try:
                    digest = _hash(raw, moved)
                    if digest not in self.blobs:
                        digest = self._write_blob(raw, moved)
                        written += raw.nbytes
                except _GivenUp:
                    return
                digests.append(digest)
            records[name] = (payload, digests)
            if isinstance(value, (types.FunctionType, type)):   # rebound, not changed in place, as a rule
                cache[name] = (value, payload, digests)
        if moved():
            return
        recorded_at = time.time()
        index = {"cell": number, "records": records, "modules": modules, "not_kept": not_kept, "time": recorded_at}
        tmp = self.folder / f"rank{self.rank}.record.tmp"
        with open(os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600), "wb") as f:
            pickle.dump(index, f, protocol=5)
        os.replace(tmp, self.index_path)
        used = {d for _, ds in records.values() for d in ds}
        for digest in self.blobs - used:   # arrays no name holds any more
            try:
                (self.folder / f"rank{self.rank}-{digest}.blob").unlink()
            except FileNotFoundError:
                pass
        self.blobs = used
        self._cache = cache
        self.cell, self.names, self.recorded_at = number, list(records) + list(modules), recorded_at
        self.written, self.seconds = written, time.perf_counter() - t0

    def _write_blob(self, raw: memoryview, stop: Optional[Callable[[], bool]] = None) -> str:
        """Write an array's bytes, hashing what is written; its digest (the file's name)."""
        flat = raw.cast("B") if raw.format != "B" or raw.ndim != 1 else raw
        tmp = self.folder / f"rank{self.rank}-blob.tmp"
        h = hashlib.sha1(usedforsecurity=False)
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        try:
            for start in range(0, flat.nbytes, _CHUNK):
                if stop is not None and start and stop():
                    raise _GivenUp
                chunk = bytes(flat[start:start + _CHUNK])   # what is hashed is what is written
                h.update(chunk)
                view = memoryview(chunk)
                while view.nbytes:
                    view = view[os.write(fd, view):]
        finally:
            os.close(fd)
        digest = f"{h.hexdigest()}-{flat.nbytes}"
        os.replace(tmp, self.folder / f"rank{self.rank}-{digest}.blob")
        self.blobs.add(digest)
        return digest

    def wait_idle(self, timeout: float) -> bool:
        """Until no record is pending or being made (tests, a clean stop); whether it got there."""
        with self._cv:
            return self._cv.wait_for(lambda: self._slot is None and not self._busy, timeout)

    def stop(self) -> None:
        with self._cv:
            self._stop = True
            self._cv.notify_all()


def cell_ended(number: int) -> None:
    """The agent's hook at a cell's clean end (:data:`.cell_end.RECORD` while recording is on)."""
    recorder = RECORDER
    if recorder is not None:
        recorder.cell_ended(number)


def enable(dirname: str, rank: int) -> dict[str, Any]:
    """Record this rank's names into this host's keep folder ``dirname`` after every clean cell."""
    global RECORDER
    from mlx_jupyter.cluster.rank import agent as _agent
    from mlx_jupyter.cluster.rank.keep_files import keep_dir, private_dir

    if RECORDER is not None:
        return describe()
    ag = _agent.AGENT
    if ag is None:
        raise RuntimeError("this rank's agent is not installed: nothing records its cells")
    folder = private_dir(keep_dir(dirname), create=True)
    RECORDER = Recorder(folder, rank, ag.shell.user_ns, getattr(ag.shell, "user_ns_hidden", None),
                        lambda: ag.cell)
    cell_end.RECORD = cell_ended
    return describe()


def disable() -> dict[str, Any]:
    """Stop recording (the record on disk stays until the cluster stops)."""
    global RECORDER
    recorder, RECORDER = RECORDER, None
    cell_end.RECORD = None
    if recorder is not None:
        recorder.stop()
    return {"on": False}


def describe(wait: float = 0.0) -> dict[str, Any]:
    """Whether this rank records, and its last record: cell, names, bytes written, seconds."""
    recorder = RECORDER
    if recorder is None:
        return {"on": False}
    if wait:
        recorder.wait_idle(wait)
    return {"on": True, "cell": recorder.cell, "names": sorted(recorder.names), "written": recorder.written,
            "seconds": round(recorder.seconds, 4), "skipped": recorder.skipped, "error": recorder.error,
            "time": recorder.recorded_at,
            "folder": str(recorder.folder)}


def restore(dirname: str, rank: int, skip: list[str]) -> dict[str, Any]:
    """Bind the names rank ``rank``'s record holds (but ``skip``: its peers gave those) into this
    rank's namespace, with the record's imports; what came back, from which cell, and what did not."""
    import mmap

    from mlx_jupyter.cluster.rank import keep
    from mlx_jupyter.cluster.rank.keep_files import keep_dir, private_dir

    folder = private_dir(keep_dir(dirname), create=False)
    path = folder / f"rank{rank}.record"
    if not path.exists():
        return {"cell": None, "restored": [], "failed": {}, "imports": []}
    with open(path, "rb") as f:
        index = pickle.load(f)
    ns = keep._user_ns()
    back = keep.import_modules({n: m for n, m in index["modules"].items() if n not in skip}, ns)
    restored, failed = [], dict(back["failed"])
    maps: dict[str, memoryview] = {}

    def blob(digest: str) -> memoryview:
        if digest not in maps:
            with open(folder / f"rank{rank}-{digest}.blob", "rb") as f:
                size = os.fstat(f.fileno()).st_size
                maps[digest] = memoryview(mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_COPY)) if size else \
                    memoryview(bytearray())
        return maps[digest]

    keep._TARGET["ns"] = ns
    try:
        for name, (payload, digests) in index["records"].items():
            if name in skip:
                continue
            try:
                ns[name] = pickle.loads(payload, buffers=[blob(d) for d in digests])
                restored.append(name)
            except Exception as exc:  # noqa: BLE001 - one name's failure costs only that name
                failed[name] = f"could not be restored from its record: {type(exc).__name__}: {str(exc)[:80]}"
    finally:
        keep._TARGET.pop("ns", None)
    return {"cell": index.get("cell"), "restored": sorted(restored), "failed": failed, "imports": back["restored"],
            "not_kept": index.get("not_kept", {})}
