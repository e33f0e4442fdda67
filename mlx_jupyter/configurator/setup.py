"""Applying the address plan: each host's setup commands, from their argv, with `sudo -n`."""

from __future__ import annotations

import asyncio
import shlex
from typing import Mapping, Sequence, Union

from mlx_jupyter.configurator.runners import Runner
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


def hosts_to_set_up(sudo: Mapping[str, bool | None], auto: bool,
                    partial: bool = False) -> tuple[list[str], dict[str, str]]:
    """Which hosts to set up over ssh, and why each other one is left to the user.

    All or none, as MLX's configurator: with auto-setup, one host without passwordless
    sudo leaves every host's commands printed, unless ``partial`` sets up those that can. A host whose
    sudo is not known (None) lacks it.
    """
    if not auto:
        return [], {h: "run these, or pass --auto-setup" for h in sudo}
    lacking = [h for h, ok in sudo.items() if not ok]
    if lacking and not partial:
        because = f"{', '.join(lacking)} lack(s) passwordless sudo, so no host was set up; run these by hand, " \
                  "or pass --partial-setup to set up the others"
        return [], {h: ("no passwordless sudo: " if h in lacking else "") + because for h in sudo}
    return [h for h in sudo if sudo[h]], {h: "no passwordless sudo: run these by hand" for h in lacking}


def hostfile_text(data: Mapping[str, object], form: str = "object") -> tuple[str, list[str]]:
    """The hostfile JSON a plan writes, checked by the launcher's reader; warnings for what ``list`` drops.

    ``object`` (``{backend, envs, hosts}``) is read by MLX 0.32 and us; ``list`` is the plain list
    MLX 0.29-0.31's ``mlx.launch`` reads, without backend and envs.
    """
    from mlx_jupyter.hostfile import hostfile_json, parse_hostfile

    hf = parse_hostfile(dict(data), "the planned hostfile")  # what we write, the launcher reads
    warnings = []
    if form == "list" and (hf.backend or hf.envs):
        dropped = [f"backend {hf.backend}"] if hf.backend else []
        dropped += [f"env {e}" for e in hf.envs]
        warnings.append(f"--hostfile-format list leaves out {', '.join(dropped)}: pass them to the launcher "
                        "(--backend, --env)")
    if form not in ("object", "list"):
        raise ValueError(f"hostfile form must be 'object' or 'list', not {form!r}")
    return hostfile_json(dict(data) if form == "object" else data["hosts"]), warnings
