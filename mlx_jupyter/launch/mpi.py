"""The mpi backend: a thin wrapper over ``mpirun`` (it starts the ranks, we start it)."""

from __future__ import annotations

import platform
import shlex
import shutil
import subprocess
from pathlib import Path
from typing import Callable, Mapping, Optional, Sequence

from mlx_jupyter import contract
from mlx_jupyter.hostfile import Host
from mlx_jupyter.launch.errors import LaunchError


def find_mpirun() -> str:
    """Path of ``mpirun``, or a clear error saying how to install it."""
    path = shutil.which("mpirun")
    if path is None:
        raise LaunchError("--backend mpi: mpirun not found on PATH; install Open MPI "
                          "(Debian/Ubuntu: apt-get install openmpi-bin; macOS: brew install open-mpi)")
    return path


def find_libmpi(timeout: float = 10.0) -> tuple[Optional[str], Optional[str]]:
    """(library file name, its directory) of the libmpi that ``ompi_info`` links, if found."""
    info = shutil.which("ompi_info")
    if info is None:
        return None, None
    darwin = platform.system() == "Darwin"
    cmd = ["otool", "-L", info] if darwin else ["ldd", info]
    try:
        out = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, check=True).stdout
    except (OSError, subprocess.SubprocessError):
        return None, None
    for line in out.splitlines():
        if "libmpi" in line and "libmpi_" not in line.split()[0]:
            name = line.split()[0].removeprefix("@rpath/")
            resolved = line.split("=>")[1].split()[0] if "=>" in line else ""
            libdir = str(Path(resolved).parent) if resolved.startswith("/") else str(Path(info).parent.parent / "lib")
            return Path(name).name, libdir
    return None, None


def mpirun_command(
    hosts: Sequence[Host],
    argv: Sequence[str],
    env: Mapping[str, str],
    token: str,
    cwd: Optional[str],
    mpi_args: Sequence[str],
    write_file: Callable[[str, str], str],
) -> tuple[str, list[str], contract.MPIPlan]:
    """(mpirun path, full argv, plan); the ``host slots=k`` file is written with ``write_file``."""
    mpirun = find_mpirun()
    libname, libdir = find_libmpi()
    plan = contract.plan_mpi(hosts, env=env, token=token, libname=libname, libdir=libdir,
                             darwin=platform.system() == "Darwin")
    hostfile = write_file("mpi-hostfile", plan.hostfile)
    cmd = [mpirun, "--hostfile", hostfile, "-np", str(plan.size)]
    if cwd:
        cmd += ["--wdir", cwd]
    for key, value in plan.env.items():
        cmd += ["-x", f"{key}={value}"]
    for arg in mpi_args:
        try:
            cmd += shlex.split(arg)
        except ValueError as exc:
            raise LaunchError(f"--mpi-arg {arg!r}: {exc}") from None
    return mpirun, [*cmd, "--", *argv], plan
