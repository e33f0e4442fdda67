"""What a launch is given: :class:`LaunchConfig` (the :class:`~mlx_jupyter.launch.Launcher` arguments)."""

from __future__ import annotations

import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Mapping, Optional, Sequence, Union

from mlx_jupyter.net import ssh
from mlx_jupyter.hostfile import Host
from mlx_jupyter.launch.errors import LaunchError

OutputCallback = Callable[[int, str, str], None]
ExitCallback = Callable[[int, int], None]


@dataclass
class LaunchConfig:
    """Everything a launch needs (the :class:`~mlx_jupyter.launch.Launcher` arguments)."""

    command: list[str]
    hosts: Union[str, Path, Sequence[Host], None] = None
    repeat_hosts: int = 1
    backend: str = "ring"
    env: Mapping[str, str] = field(default_factory=dict)
    cwd: Optional[str] = None
    cwd_required: bool = False
    python: str = sys.executable
    starting_port: int = 32323
    connections_per_ip: int = 1
    nccl_port: int = 12345
    rank_env: Optional[Callable[[int], Mapping[str, str]]] = None
    on_output: Optional[OutputCallback] = None
    on_exit: Optional[ExitCallback] = None
    ssh_options: Optional[ssh.SSHOptions] = None
    stdin: bool = False
    terminate_on_failure: bool = True
    grace: float = 1.0                # SIGTERM -> SIGKILL when tearing down after a failure
    start_timeout: float = 30.0
    verbose: bool = False
    mpi_args: list[str] = field(default_factory=list)


def rank_argv(command: Sequence[str], python: str) -> list[str]:
    """The argv a rank runs: a ``.py`` script runs with ``python``."""
    if not command:
        raise LaunchError("no command given: what should every rank run?")
    argv = [str(a) for a in command]
    return [python, *argv] if argv[0].endswith(".py") else argv
