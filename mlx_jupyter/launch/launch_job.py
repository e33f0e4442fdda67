"""The one face of a launch, :class:`LaunchJob`: what the :class:`~mlx_jupyter.launch.Launcher` and the CLI drive.

:class:`~mlx_jupyter.launch.job.Job` (local, ssh, mpirun) and
:class:`~mlx_jupyter.launch.slurm.job.SlurmJob` (one srun step) both show it; ``make_job`` picks one.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Optional, Protocol, Sequence

from mlx_jupyter.vocab.rankinfo import RankInfo

if TYPE_CHECKING:
    from mlx_jupyter.where.model import Where


class LaunchJob(Protocol):
    """One launch. Create, ``await start()``, then ``await wait()``; ``stop()`` tears it down."""

    @property
    def token(self) -> str:
        """This launch's ``MLX_JUPYTER_TOKEN``."""

    @property
    def ranks(self) -> list[RankInfo]:
        """Per-rank info: rank, host, pid (on its host), state, returncode."""

    @property
    def size(self) -> int:
        """Number of ranks (under Slurm: as asked for until the allocation's nodes are known)."""

    async def start(self) -> None:
        """Start every rank; return once all have started, or tear down and raise ``LaunchError``."""

    async def wait(self, timeout: Optional[float] = None) -> int:
        """Wait for every rank to end; 0 if all exited 0, else the first failing rank's code."""

    async def stop(self, timeout: float = 2.0) -> None:
        """End every running rank (SIGTERM, SIGKILL after the grace time) and clean up."""

    async def signal(self, sig: int, ranks: Optional[Sequence[int]] = None) -> None:
        """Send ``sig`` to ``ranks`` (default: every running rank)."""

    async def where(self, timeout: float = 2.0) -> Where:
        """Where every rank is (the ranks started with ``where_on_signal`` answer within ``timeout`` s)."""

    def write_stdin(self, data: bytes, rank: Optional[int] = None) -> None:
        """Write ``data`` to ``rank``'s stdin, or to every rank's (None)."""

    def close_stdin(self, others_than: Optional[int] = None) -> None:
        """EOF to every rank's stdin (but ``others_than``'s, if given)."""

    def exit_code(self) -> int:
        """0, or the code of the first rank that failed (255 for a lost host)."""

    def summary(self) -> str:
        """One line naming each failed, lost or terminated rank with its host."""
