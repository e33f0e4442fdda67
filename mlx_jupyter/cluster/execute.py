"""Plain Python's blocking cell: :func:`execute` (``Cluster.execute``) runs code on the ranks as a
``%%mlx_distributed`` cell does, prints what the ranks print, and returns or raises once every rank
has ended (a rank that raises releases the others, as in a notebook)."""

from __future__ import annotations

import sys
import time
from typing import TYPE_CHECKING, Optional, Protocol, Sequence, TextIO

if TYPE_CHECKING:
    from mlx_jupyter.cluster.cells.run import CellRun


class CellStarter(Protocol):
    """What :func:`execute` needs of a cluster: a supervised run of a cell (``Cluster.run``)."""

    def run(self, code: str, targets: Optional[Sequence[int]] = None, *, init: bool = True) -> CellRun: ...


def _write(stream: TextIO, rank: int, text: str, pending: dict[int, str], noise: list[int]) -> None:
    """Write ``text`` of ``rank`` line by line, each ``[rank N] ``-prefixed; keep a partial line.
    MLX's ring socket errors after a release are counted in ``noise``, not shown."""
    from mlx_jupyter.cluster.cells.display import RING_NOISE

    lines = (pending.pop(rank, "") + text).split("\n")
    for line in lines[:-1]:
        if RING_NOISE.match(line.strip()):
            noise.append(rank)
        else:
            stream.write(f"[rank {rank}] {line}\n")
    if lines[-1]:
        pending[rank] = lines[-1]


def execute(cluster: CellStarter, code: str, targets: Optional[Sequence[int]] = None, timeout: Optional[float] = None,
            init: bool = True) -> list[Optional[str]]:
    """Run ``code`` on ``targets`` (default every rank) and wait until it has ended everywhere.

    Returns each rank's result in rank order: the text (repr) of the value of the code's last
    expression, None when it ends with a statement. Raises
    :class:`~mlx_jupyter.cluster.cells.display.DistributedCellError` naming the rank that raised
    and its error (the others were released), also after ``timeout`` s (the ranks are stopped first).
    """
    from mlx_jupyter.cluster.cells.display import failure

    run = cluster.run(code, targets, init=init)
    results: dict[int, Optional[str]] = {}
    partial: dict[tuple[int, str], str] = {}
    noise: list[int] = []
    deadline = None if timeout is None else time.monotonic() + timeout
    try:
        while not (run.done.is_set() and run.events.empty()):
            ev = run.next_event(0.05)
            if ev is not None and ev.kind == "stream":
                name, text = ev.payload
                stream = sys.stderr if name == "stderr" else sys.stdout
                pending = {ev.rank: partial.pop((ev.rank, name), "")}
                _write(stream, ev.rank, text, pending, noise)
                if pending.get(ev.rank):
                    partial[(ev.rank, name)] = pending[ev.rank]
            elif ev is not None and ev.kind == "result":
                results[ev.rank] = (ev.payload.get("data") or {}).get("text/plain")
            elif ev is not None and ev.kind == "notice":
                sys.stderr.write(f"{ev.payload}\n")
            run.check_deadlines()
            if deadline is not None and time.monotonic() > deadline:
                deadline = None
                run.interrupt(f"the code did not end within {timeout:g} s (timeout={timeout:g})")
    except KeyboardInterrupt:
        run.interrupt("interrupted by the user")
        run.wait(run.release_deadline + 1.0)
        raise
    for (rank, name), text in partial.items():
        (sys.stderr if name == "stderr" else sys.stdout).write(f"[rank {rank}] {text}\n")
    if noise:
        sys.stderr.write(f"({len(noise)} MLX ring socket errors hidden: its sockets were shut down to release a rank)\n")
    if run.failed:
        raise failure(run)
    return [results.get(r) for r in run.ranks]
