"""What a launch is given: :class:`LaunchConfig` (the :class:`~mlx_jupyter.launch.Launcher` arguments)."""

from __future__ import annotations

import os
import shutil
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Callable, Mapping, Optional, Sequence, Union

from mlx_jupyter.net import ssh
from mlx_jupyter.vocab.options import option
from mlx_jupyter.hostfile import Host
from mlx_jupyter.launch.errors import LaunchError
from mlx_jupyter.vocab.ports import DEFAULT_NCCL_PORT, DEFAULT_STARTING_PORT

if TYPE_CHECKING:
    from mlx_jupyter.launch.slurm.options import SlurmOptions

#: ``on_output(rank, "stdout" | "stderr", line)``; rank -1: mpirun's or srun's own lines. An unfinished
#: line comes in pieces, one call each (see :class:`~mlx_jupyter.launch.rank_output.RankOutput`)
OutputCallback = Callable[[int, str, str], None]
#: ``on_text(rank, stream, text, ends_line)``: text as it comes; ``ends_line`` False for a piece of an unfinished line
TextCallback = Callable[[int, str, str, bool], None]
#: ``on_exit(rank, returncode)``; None under Slurm when no code is known (a rank lost, or ended by Slurm)
ExitCallback = Callable[[int, Optional[int]], None]


@dataclass
class LaunchConfig:
    """Everything a launch needs (the :class:`~mlx_jupyter.launch.Launcher` arguments)."""

    command: list[str]
    hosts: Union[str, Path, Sequence[Host], None] = None
    repeat_hosts: Optional[int] = None  # None: hostfile.default_ranks_per_host
    backend: Optional[str] = None     # None: a hostfile's, else backends.default_backend()
    env: Mapping[str, str] = field(default_factory=dict)
    cwd: Optional[str] = None
    cwd_required: bool = False
    python: str = sys.executable
    starting_port: Optional[int] = None   # None: DEFAULT_STARTING_PORT (Slurm: derived from the job id)
    connections_per_ip: int = 1
    nccl_port: int = DEFAULT_NCCL_PORT
    rank_env: Optional[Callable[[int], Mapping[str, str]]] = None
    on_output: Optional[OutputCallback] = None
    on_text: Optional[TextCallback] = None
    on_exit: Optional[ExitCallback] = None
    ssh_options: Optional[ssh.SSHOptions] = None
    stdin: bool = False
    stdin_rank: Optional[int] = None  # the one rank the terminal's stdin goes to (others read EOF); None: all
    terminate_on_failure: bool = True
    grace: float = 1.0                # SIGTERM -> SIGKILL when tearing down after a failure
    start_timeout: float = 30.0
    verbose: bool = False
    jaccl_coordinator: bool = True   # False: JACCL bootstraps over our core's ring, no coordinator port (contract)
    mpi_args: list[str] = field(default_factory=list)
    where_on_signal: bool = False   # Python ranks answer SIGUSR1 with where they are (mlx_jupyter.where.boot)
    bind_to: str = option("bind_to").default   # local ranks: each on its own share of the CPUs (vocab.binding), or "none"
    slurm: Optional["SlurmOptions"] = None   # run the ranks as a Slurm job step (mlx_jupyter.launch.slurm)


def local_script(first: str, cwd: Optional[str] = None) -> Optional[str]:
    """The absolute path of ``first`` when it names an existing file here (from ``cwd`` if that exists)."""
    base = cwd if cwd and os.path.isdir(cwd) else os.getcwd()
    path = os.path.join(base, os.path.expanduser(first))
    return os.path.abspath(path) if os.path.isfile(path) else None


#: Commands that mean "a Python": they run ``--python`` (default: the launcher's own interpreter),
#: not whichever ``python`` comes first on the ranks' PATH (a venv that is not activated).
BARE_PYTHONS = ("python", "python3")


def rank_argv(command: Sequence[str], python: str, cwd: Optional[str] = None) -> list[str]:
    """The argv a rank runs, as MLX's launcher: a file here (any name) runs with ``python`` by its
    absolute path; a ``.py`` missing here still runs with ``python``; a bare ``python``/``python3``
    is ``python``; anything else as is.

    Unlike MLX, an executable file that is not a ``.py`` (``/usr/bin/python3``, ``./run.sh``) runs as itself.
    """
    if not command:
        raise LaunchError("no command given: what should every rank run?")
    argv = [str(a) for a in command]
    if argv[0] in BARE_PYTHONS:
        return [python, *argv[1:]]
    script = local_script(argv[0], cwd)
    if script is not None and (argv[0].endswith(".py") or not os.access(script, os.X_OK)):
        return [python, script, *argv[1:]]
    return [python, *argv] if argv[0].endswith(".py") else argv


def interpreter_of(argv: Sequence[str], local: bool) -> Optional[str]:
    """The Python a rank's argv runs, as far as this machine can tell (None: not a Python command)."""
    first = argv[0] if argv else ""
    if not os.path.basename(first).startswith("python"):
        return None
    if os.path.isabs(first) or not local:
        return first
    return shutil.which(first) or first
