"""A rank that died, given back what its live peers hold alike, from the rank side: each live rank
saves its names with a digest per name (:func:`save_digested`), and the dead rank's new process
binds the chosen names from one peer's saved files on its own host (:func:`restore_from`): the
files are in shared memory (or the temp dir), mapped and read in place, never sent through the
notebook. The peer's files stay for the peer's own restore, which removes them.
"""

from __future__ import annotations

import mmap
import pickle
from typing import Any, MutableMapping, Optional

from mlx_jupyter.cluster.rank import keep
from mlx_jupyter.cluster.rank.keep_files import private_dir, rank_folder


def save_digested(dirname: str, rank: int) -> dict:
    """:func:`keep.save`, with each name's digest (``"digests"``) to compare across the live ranks."""
    return keep.save(dirname, rank, digests=True)


def restore_from(dirname: str, peer: int, names: list[str], ns: Optional[MutableMapping[str, Any]] = None) -> dict:
    """Bind ``names`` (and every import) that rank ``peer`` saved on this host into this rank's
    namespace; what came back and what did not (the peer's files are left in place)."""
    if ns is None:
        ns = keep._user_ns()
    folder = private_dir(rank_folder(dirname, peer), create=False)
    index_path, data_path = folder / f"rank{peer}.index", folder / f"rank{peer}.data"
    if not index_path.exists():
        raise FileNotFoundError(f"rank {peer}'s saved names are not on this host ({folder})")
    with open(index_path, "rb") as f:
        index = pickle.load(f)
    back = keep.import_modules(index["modules"], ns, overwrite=True)
    wanted = [n for n in names if n not in index["modules"]]
    restored, failed = [], dict(back["failed"])
    mapped = None
    if data_path.stat().st_size:
        with open(data_path, "rb") as f:
            mapped = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_COPY)
    view = memoryview(mapped) if mapped is not None else memoryview(b"")
    keep._TARGET["ns"] = ns
    before = dict(ns)
    try:
        values = _whole(index, view)
        if values is not None and all(n in values for n in wanted):
            # all names from one pickle: what they share stays shared (a step function and its optimizer)
            for name in wanted:
                ns[name] = values[name]
            restored.extend(wanted)
        else:
            records = {name: (payload, spans) for name, payload, spans in index["records"]}
            for name in wanted:
                if name not in records:
                    failed[name] = f"rank {peer} did not save it"
                    continue
                payload, spans = records[name]
                try:
                    ns[name] = pickle.loads(payload, buffers=[view[o:o + n] for o, n in spans])
                    restored.append(name)
                except Exception as exc:  # noqa: BLE001 - one name's failure costs only that name
                    failed[name] = f"could not be restored: {type(exc).__name__}: {str(exc)[:80]}"
    finally:
        keep._TARGET.pop("ns", None)
        _only(ns, before, set(restored) | set(back["restored"]))
    return {"restored": restored, "imports": back["restored"], "failed": failed, "peer": peer}


def _only(ns: MutableMapping[str, Any], before: dict, kept: set[str]) -> None:
    """Undo what unpickling bound besides ``kept``: a function brings the globals it reads, and
    one that reads a name that differs across ranks (a shard) must not leave the peer's value."""
    for name in [n for n in ns if n not in kept and (n not in before or ns[n] is not before[n])]:
        if name in before:
            ns[name] = before[name]
        else:
            del ns[name]


def _whole(index: dict, view: memoryview) -> Optional[dict]:
    """Every name the peer saved, from its one pickle of them all (None if that fails)."""
    whole, spans = index["whole"]
    if whole is None:
        return None
    try:
        return pickle.loads(whole, buffers=[view[o:o + n] for o, n in spans])
    except Exception:  # noqa: BLE001 - then name by name
        return None
