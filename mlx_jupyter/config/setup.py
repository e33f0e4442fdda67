"""Applying the address plan: each host's setup commands, from their argv, with `sudo -n`."""

from __future__ import annotations

import asyncio
import shlex
from typing import Mapping, Sequence, Union

from mlx_jupyter.config.runners import Runner
from mlx_jupyter.topology.addressing import BRIDGE_DOWN, SETUP_PROGRAMS, SetupLine
from mlx_jupyter.topology.system_profiler import first_line

SetupCommand = Union[SetupLine, Sequence[str]]


def setup_argv(command: SetupCommand) -> tuple[str, ...]:
    """The argv of a planned setup command (a `SetupLine` or an argv); plain text is refused, never split."""
    if isinstance(command, SetupLine):
        argv = command.argv
    elif isinstance(command, str):
        raise TypeError(f"setup commands are run from their argv, not from text: {command!r}")
    else:
        argv = tuple(command)
    if not argv or argv[0] not in SETUP_PROGRAMS:
        raise ValueError(f"not a setup command (only {', '.join(SETUP_PROGRAMS)}): {argv!r}")
    return argv


async def apply_setup(runner: Runner, commands: Mapping[str, Sequence[SetupCommand]]) -> dict[str, list[str]]:
    """Run each host's setup commands in order with `sudo -n` (hosts in parallel); return failures per host."""
    planned = {h: [setup_argv(c) for c in lines] for h, lines in commands.items()}  # refuse before running any

    async def one(host: str, argvs: list[tuple[str, ...]]) -> list[str]:
        failures = []
        for argv in argvs:
            run = ("sudo", "-n", *argv)  # -n: fail instead of prompting for a password
            result = await runner.run(host, list(run))
            if not result.ok and argv != BRIDGE_DOWN:  # a deleted Thunderbolt Bridge is fine
                failures.append(f"`{shlex.join(run)}` exited {result.rc}: {first_line(result.stderr or result.stdout)}")
        return failures

    results = await asyncio.gather(*(one(h, c) for h, c in planned.items()))
    return {h: f for h, f in zip(planned, results) if f}
