"""The allocation the ranks run in: one we ask for (and release), or the one we already run inside.

Blocking (Slurm's commands are): asyncio callers use a thread. Waiting for a
pending job probes squeue every ``poll_interval`` seconds (Slurm has no push
notification for it) and ends at once when ``cancelled`` is set.
"""

from __future__ import annotations

import sys
import threading
from typing import Callable, Mapping, Optional

from mlx_jupyter.launch.slurm import commands
from mlx_jupyter.launch.slurm.commands import SlurmError
from mlx_jupyter.launch.slurm.options import SlurmOptions, allocation_argv, inside_allocation
from mlx_jupyter.launch.slurm.parse import JobState


class WaitCancelled(SlurmError):
    """The wait for a pending job was cancelled (Ctrl-C, stop); the job has been cancelled."""


class Allocation:
    """A Slurm job whose nodes our steps run on. ``owned``: we submitted it, so we release it."""

    def __init__(self, job_id: int, owned: bool, nodelist: str = ""):
        self.job_id = job_id
        self.owned = owned
        self.nodelist = nodelist
        self.released = False

    @classmethod
    def current(cls, env: Mapping[str, str]) -> Optional["Allocation"]:
        """The allocation this process runs inside (``SLURM_JOB_ID``), if any."""
        job = inside_allocation(env)
        if job is None:
            return None
        return cls(job, owned=False, nodelist=env.get("SLURM_JOB_NODELIST") or env.get("SLURM_NODELIST") or "")

    @classmethod
    def submit(cls, opts: SlurmOptions, name: str) -> "Allocation":
        """Ask for ``opts.nodes`` nodes (sbatch returns at once; the job may pend)."""
        return cls(commands.submit(allocation_argv(opts, name)), owned=True)

    def nodes(self) -> list[str]:
        """The allocation's nodes, in Slurm's order."""
        if not self.nodelist:
            state = commands.job_state(self.job_id)
            if state is None or not state.nodes:
                raise SlurmError(f"Slurm job {self.job_id}: no nodes (squeue: {state.describe() if state else 'unknown job'})")
            self.nodelist = state.nodes
        return commands.hostnames(self.nodelist)

    def wait_running(self, cancelled: threading.Event, poll_interval: float = 1.0,
                     on_state: Optional[Callable[[JobState], None]] = None) -> JobState:
        """Block until the job runs; report each new state; cancel the job and raise if ``cancelled``."""
        last = ""
        while True:
            state = commands.job_state(self.job_id)
            if state is None:
                raise SlurmError(f"Slurm job {self.job_id} is gone from the queue before it ran (scancel'ed elsewhere?)")
            text = state.describe()
            if text != last and on_state is not None:
                on_state(state)
            last = text
            if state.running:
                self.nodelist = state.nodes
                return state
            if state.finished:
                raise SlurmError(f"Slurm job {self.job_id} ended before it ran: {text} "
                                 f"(reason: {state.reason or 'none given'})")
            if cancelled.wait(poll_interval):
                self.release()
                raise WaitCancelled(f"Slurm job {self.job_id} cancelled while {text}")

    def release(self) -> None:
        """Cancel the job if we submitted it (once)."""
        if self.owned and not self.released:
            self.released = commands.cancel(str(self.job_id))


def print_state(prefix: str) -> Callable[[JobState], None]:
    """An ``on_state`` that writes ``PREFIX: Slurm job 12 PENDING (Resources)`` to stderr."""
    def show(state: JobState) -> None:
        print(f"{prefix}: Slurm job {state.job_id} {state.describe()}", file=sys.stderr, flush=True)
    return show
