"""A launched rank's answer to SIGUSR1: one line on stderr saying where its main thread is.

Installed by the launcher's boot code (:mod:`.boot`) when the launch asked for it
(``mlx-jupyter launch --where-on-signal``). SIGUSR1 is blocked in every thread and a thread of
ours waits for it (``sigwait``), so the answer comes even while the main thread is blocked in
native code (an MLX collective releases the GIL): no Python handler has to run on it. The line is
:data:`MARKER` and the sample as JSON; the launcher reads it from the rank's stderr.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import threading
from typing import Any, Mapping, Optional

from mlx_jupyter.where import mlx_calls, sample

#: how a where line starts on a rank's stderr
MARKER = "\x1emlx-jupyter-where "


def _main_file() -> tuple[str, ...]:
    main = sys.modules.get("__main__")
    path = getattr(main, "__file__", None)
    return (os.path.abspath(path), path) if path else ("<string>",)   # python -c CODE


def report(rank: int, cpu: Optional[sample.CpuMeter] = None) -> None:
    """Write this process's where line to stderr (fd 2, unbuffered: the main thread may hold sys.stderr's lock)."""
    s = sample.take(None, rank, cpu, _rss(), cell_files=_main_file())
    s.pop("still", None)  # one look: how long it has been there is not known (the table then trusts the look)
    os.write(2, (MARKER + json.dumps(s, default=str) + "\n").encode())


def _rss() -> int:
    try:
        import resource

        scale = 1 if sys.platform == "darwin" else 1024
        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * scale
    except Exception:
        return 0


def _rank_of(env: Mapping[str, str]) -> int:
    """This process's rank as its launcher said it (MLX's variable, else mpirun's or Slurm's); 0 if none."""
    from mlx_jupyter.vocab.rank_env import OTHER_RANKS, RANK

    for var in (RANK, *OTHER_RANKS):
        if (env.get(var) or "").isdigit():
            return int(env[var])
    return 0


def install(rank: Optional[int] = None) -> threading.Thread:
    """Block SIGUSR1 here (threads started later inherit it) and answer it from a thread of ours.

    Call from the main thread before other threads start.
    """
    if rank is None:
        rank = _rank_of(os.environ)
    mlx_calls.install_when_imported()  # the script's MLX collectives, named in its answer
    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGUSR1})
    cpu = sample.CpuMeter()

    def wait() -> None:
        while True:
            signal.sigwait({signal.SIGUSR1})
            try:
                report(rank, cpu)
            except Exception as exc:  # never end the rank for a where
                os.write(2, f"mlx-jupyter: where failed: {exc}\n".encode())

    thread = threading.Thread(target=wait, name="mlx-where-on-signal", daemon=True)
    thread.start()
    return thread


def parse(line: str) -> Optional[dict[str, Any]]:
    """The sample in a where line (None: not one, or garbled)."""
    if not line.startswith(MARKER):
        return None
    try:
        value = json.loads(line[len(MARKER):])
    except ValueError:
        return None
    return value if isinstance(value, dict) else None
