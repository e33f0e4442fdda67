"""A rank's saved names written to its keep folder: the data file (raw buffers, each once, aligned) and
the index (pickles and where each buffer is), in the first place on the host with room for them."""

from __future__ import annotations

import errno
import os
import pickle
import shutil
from pathlib import Path
from typing import Any, Optional

from mlx_jupyter.cluster.rank.keep_files import keep_dir, keep_roots, private_dir
from mlx_jupyter.cluster.shared.units import format_bytes


def address(buf: pickle.PickleBuffer) -> tuple[int, int]:
    """Where a buffer's memory is: the same array met by two pickles is written once."""
    import numpy as np

    raw = buf.raw()
    return (np.frombuffer(raw, dtype=np.uint8).__array_interface__["data"][0] if raw.nbytes else 0), raw.nbytes


class NoRoom(OSError):
    """No place on this host has room for a rank's saved names."""

    def __str__(self) -> str:
        return str(self.strerror)


#: room left free beside the files (the new ranks and the OS need some too)
MARGIN = 64 << 20


class SavedFiles:
    """A rank's saved names as two files: the data (raw buffers, each once) and the index (pickles
    and where each buffer is in the data), written where the host has room."""

    def __init__(self, whole: Optional[bytes], together: list[pickle.PickleBuffer], singles: dict[str, Any],
                 modules: dict[str, str]) -> None:
        self.whole, self.together, self.singles, self.modules = whole, together, singles, modules
        self.folder: Optional[Path] = None

    def size(self) -> int:
        """The bytes the files will take (each buffer once, padded; the pickles twice at most)."""
        seen: dict[tuple[int, int], int] = {}
        for buf in [*self.together, *(b for _, found in self.singles.values() for b in found)]:
            key = address(buf)
            seen[key if key[0] else (id(buf), key[1])] = key[1] + 64
        pickles = len(self.whole or b"") + sum(len(payload) for payload, _ in self.singles.values())
        return sum(seen.values()) + 2 * pickles + 4096

    def write_somewhere(self, dirname: str, rank: int) -> int:
        """Write into the first place with room (shared memory, then the temp dir); the bytes written."""
        need, tried = self.size(), []
        for root in keep_roots():
            free = free_bytes(root)
            if free is not None and free < need + MARGIN:
                tried.append(f"{format_bytes(free)} free in {root}")
                continue
            folder = private_dir(keep_dir(dirname, root), create=True)
            try:
                written = self._write(folder, rank)
            except OSError as exc:
                if exc.errno not in (errno.ENOSPC, errno.EDQUOT):
                    raise
                discard_in(folder, rank)
                tried.append(f"{root} filled up")
                continue
            self.folder = folder
            return written
        raise NoRoom(errno.ENOSPC, f"no room for this rank's {format_bytes(need)} of names ({'; '.join(tried)}): "
                     "delete large names first, or restart with --clean")

    def _write(self, folder: Path, rank: int) -> int:
        spans: dict[tuple[int, int], tuple[int, int]] = {}
        fd = os.open(folder / f"rank{rank}.data", os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        offset = 0

        def span(buf: pickle.PickleBuffer) -> tuple[int, int]:
            nonlocal offset
            key = address(buf)
            if key not in spans or key[0] == 0:
                raw = buf.raw()
                spans[key] = (offset, raw.nbytes)
                write_all(fd, raw)
                offset += raw.nbytes
                offset += pad(fd, offset)
            return spans[key]

        try:
            whole_spans = [span(b) for b in self.together]
            records = [(name, payload, [span(b) for b in found]) for name, (payload, found) in self.singles.items()]
        finally:
            os.close(fd)
        index = {"whole": (self.whole, whole_spans), "records": records, "modules": self.modules}
        with open(os.open(folder / f"rank{rank}.index", os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600), "wb") as f:
            pickle.dump(index, f, protocol=5)
        return offset + len(self.whole or b"")


def free_bytes(root: Path) -> Optional[int]:
    try:
        return shutil.disk_usage(root).free
    except OSError:
        return None


def write_all(fd: int, raw: memoryview) -> None:
    view = raw.cast("B") if raw.format != "B" or raw.ndim != 1 else raw
    while view.nbytes:
        done = os.write(fd, view)
        view = view[done:]


def pad(fd: int, offset: int, align: int = 64) -> int:
    """Align the next buffer (numpy and MLX like aligned data)."""
    extra = (-offset) % align
    if extra:
        os.write(fd, b"\0" * extra)
    return extra


def discard_in(folder: Path, rank: int) -> None:
    """Remove rank ``rank``'s files in ``folder``, and the folder once it is empty."""
    remove_quietly([folder / f"rank{rank}.{suffix}" for suffix in ("index", "data")], folder)


def remove_quietly(paths: list[Path], folder: Path) -> None:
    """Remove ``paths`` (those that exist), then ``folder`` if nothing else is left in it."""
    for path in paths:
        try:
            path.unlink()
        except FileNotFoundError:
            pass
    try:
        folder.rmdir()
    except OSError:
        pass
