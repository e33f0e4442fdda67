"""The mpi backend: a thin wrapper over ``mpirun`` (it starts the ranks, we start it).

With Open MPI, ``--tag-output`` marks each line with its rank (parsed back
into per-rank lines by :class:`TaggedOutput`), ``--stdin all`` broadcasts
stdin when no rank runs on this machine (see :func:`mpirun_command`), and
each rank reports its own exit status (:mod:`mlx_jupyter.launch.mpi_exits`) for the summary;
mpirun's report of the first failing rank is the fallback where no rank could report.
"""

from __future__ import annotations

import os
import platform
import re
import shlex
import shutil
import socket
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Mapping, Optional, Sequence

from mlx_jupyter.launch import contract, mpi_exits
from mlx_jupyter.vocab.hosts import bare_host, is_local
from mlx_jupyter.hostfile import Host
from mlx_jupyter.launch.errors import LaunchError


def find_mpirun() -> str:
    """Path of ``mpirun``, or a clear error saying how to install it."""
    path = shutil.which("mpirun")
    if path is None:
        raise LaunchError("--backend mpi: mpirun not found on PATH; install Open MPI "
                          "(Debian/Ubuntu: apt-get install openmpi-bin; macOS: brew install open-mpi)")
    return path


#: Open MPI's mpirun refuses to run as root unless both are exactly "1" (or --allow-run-as-root).
ROOT_VARS = ("OMPI_ALLOW_RUN_AS_ROOT", "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM")


#: What an enclosing MPI job (or an MPI singleton: MLX's `init()` with no launcher initialises
#: MPI in-process) leaves in the environment of its children. Open MPI's mpirun started with
#: these exits 1 and prints nothing, so they never reach an mpirun we start.
ENCLOSING_JOB_PREFIXES = ("PMIX_", "ORTE_", "OMPI_COMM_WORLD_", "OMPI_APP_CTX_", "OMPI_MCA_orte_ess_")
ENCLOSING_JOB_VARS = frozenset({
    "OMPI_MCA_ess", "OMPI_MCA_pmix", "OMPI_MCA_orte_launch", "OMPI_MCA_orte_precondition_transports",
    "OMPI_UNIVERSE_SIZE", "OMPI_FIRST_RANKS", "OMPI_FILE_LOCATION", "OMPI_NUM_APP_CTX",
    "OMPI_MCA_orte_hnp_uri", "OMPI_MCA_orte_local_daemon_uri", "OMPI_MCA_orte_num_nodes",
})


def outside_enclosing_job(env: Mapping[str, str]) -> dict[str, str]:
    """``env`` without what an enclosing MPI job or singleton set (user MCA settings stay)."""
    return {k: v for k, v in env.items()
            if k not in ENCLOSING_JOB_VARS and not k.startswith(ENCLOSING_JOB_PREFIXES)}


def check_root(env: Mapping[str, str], mpi_args: Sequence[str], euid: Optional[int] = None) -> None:
    """As root, fail before starting unless Open MPI has been told to allow it (in ``env`` or ``mpi_args``).

    We don't allow it ourselves: running MPI jobs as root is Open MPI's warning
    to give, and the user's choice to override.
    """
    if euid is None:
        euid = os.geteuid() if hasattr(os, "geteuid") else -1
    if euid != 0 or all(env.get(v) == "1" for v in ROOT_VARS):
        return
    words = [w for a in mpi_args for w in a.split()]
    if "--allow-run-as-root" in words or "-allow-run-as-root" in words:
        return
    unset = [v for v in ROOT_VARS if env.get(v) != "1"]
    raise LaunchError(
        "--backend mpi as root: Open MPI's mpirun refuses to run as root unless "
        f"{' and '.join(f'{v}=1' for v in ROOT_VARS)} are set (not set to 1: {', '.join(unset)}). "
        "Run as an ordinary user, or if you mean it set both: in a hostfile's \"envs\" (which works "
        "everywhere, the MLX Cluster panel's hostfile field too), with "
        f"`{' '.join(f'--env {v}=1' for v in ROOT_VARS)}` "
        "(`mlx-jupyter launch`, `%mlx_cluster start`), or export both in the shell "
        "that starts the launcher or Jupyter."
    )


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


def open_mpi_version(mpirun: str, timeout: float = 10.0) -> Optional[tuple[int, int]]:
    """(major, minor) if ``mpirun`` is Open MPI's, else None."""
    try:
        out = subprocess.run([mpirun, "--version"], capture_output=True, text=True, timeout=timeout).stdout
    except (OSError, subprocess.SubprocessError):
        return None
    m = re.search(r"\(Open MPI\)\s+(\d+)\.(\d+)", out) or re.search(r"Open MPI\D*(\d+)\.(\d+)", out)
    return (int(m.group(1)), int(m.group(2))) if m else None


#: ``[jobid,rank]<stdout>:`` as Open MPI 4's --tag-output writes it; 5 (PRRTE) may add a space.
_TAG = re.compile(r"\[(\d+),(\d+)\]<(stdout|stderr|stddiag)>:")
_TAG5 = re.compile(r"\[(\d+),(\d+)\]<(stdout|stderr|stddiag)>: ?")
_FIRST_FAILED = re.compile(r"Process name:\s*\[\[\d+,\d+\],(\d+)\]")
_EXIT_CODE = re.compile(r"Exit code:\s*(-?\d+)")
_SIGNALLED = re.compile(r"process rank (\d+) with PID \d+ on node (\S+) exited on signal (\d+)(?: \(([^)]*)\))?")


#: what the end of a piece of mpirun's line may hold of a tag cut short (held until more comes)
_TAG_START = re.compile(r"\[[\d,\]<a-z>]{0,40}(: ?)?")


def _cut_tag(text: str) -> int:
    """Where a tag cut short at the end of ``text`` begins (``len(text)``: none)."""
    at = text.rfind("[")
    return at if at >= 0 and _TAG_START.fullmatch(text, at) else len(text)


def _key(tag: "re.Match[str]") -> tuple[int, str]:
    """(rank, "stdout" | "stderr") of a tag (stddiag counts as stderr)."""
    return int(tag.group(2)), "stdout" if tag.group(3) == "stdout" else "stderr"


@dataclass
class Failure:
    """The failing rank as mpirun reports it."""

    rank: int
    what: str                  # "exited with code 3" / "was killed by signal 9 (Killed)"
    node: Optional[str] = None


class TaggedOutput:
    """mpirun's output, tagged lines in, ``emit(rank, stream, text, ends_line)`` out; rank -1 for mpirun's own lines.

    Open MPI tags each chunk a rank writes as it comes, and a line written in pieces (an unbuffered
    ``print``, a reply streamed token by token) is spread over tags of mpirun's lines, between other
    ranks' chunks: only a chunk that ends mpirun's line ended with a newline, so the others go on as
    pieces of their rank's line (``ends_line`` False). :meth:`piece` takes mpirun's line as it comes.
    """

    def __init__(self, emit: Callable[[int, str, str, bool], None], version: tuple[int, int] = (4, 0),
                 marker: Optional[str] = None):
        self._emit = emit
        self._tag = _TAG5 if version >= (5, 0) else _TAG
        self._said: Optional[Failure] = None          # what mpirun's own message says
        self.exits = mpi_exits.ExitMarkers(marker) if marker else None
        self._pending_rank: Optional[int] = None
        self._open: set[tuple[int, str]] = set()   # (rank, stream) whose line came in part so far
        self._rest: dict[str, str] = {}            # stream -> what is held of mpirun's line (untagged, or a cut tag)
        self._current: dict[str, tuple[int, str]] = {}   # stream -> the rank whose chunk mpirun's line is in

    def line(self, stream: str, text: str) -> None:
        """One line of mpirun's stdout or stderr (without its newline)."""
        self.piece(stream, text, True)

    def piece(self, stream: str, text: str, ends: bool) -> None:
        """A piece of mpirun's line on ``stream``; ``ends``: its newline came."""
        text = self._rest.pop(stream, "") + text
        current = self._current.pop(stream, None)
        if not ends:
            if current is None and not self._tag.search(text):   # mpirun's own line: read whole
                self._rest[stream] = text
                return
            cut = _cut_tag(text)
            text, self._rest[stream] = text[:cut], text[cut:]
        tags = list(self._tag.finditer(text))
        lead = text[: tags[0].start()] if tags else text
        if current is not None:
            self._put(current, lead, ends and not tags)
        elif lead:   # untagged text: mpirun's own line, or the end of one before a tag
            self._scan(lead)
            self._emit(-1, stream, lead, True)
        for i, m in enumerate(tags):
            last = i + 1 == len(tags)
            self._put(_key(m), text[m.end():len(text) if last else tags[i + 1].start()], last and ends)
        after = _key(tags[-1]) if tags else current
        if not ends and after is not None:
            self._current[stream] = after

    @property
    def failure(self) -> Optional[Failure]:
        """The first rank to fail: from the ranks' own exit reports, else from mpirun's message."""
        first = self.exits.first_failure() if self.exits is not None else None
        if first is not None:
            return Failure(first.rank, first.what())
        return self._said

    def flush(self) -> None:
        """End the ranks' unfinished lines (at the end of the run)."""
        ended, self._open = self._open, set()
        for rank, kind in sorted(ended):
            self._emit(rank, kind, "", True)

    def _put(self, key: tuple[int, str], text: str, ends: bool) -> None:
        if ends and self.exits is not None and key[1] == "stderr":   # a rank's exit report ends its stderr
            rest = self.exits.take(key[0], text)
            if rest is None:
                if key in self._open:
                    self._open.discard(key)
                    self._emit(key[0], key[1], "", True)
                return
            text = rest
        if ends:
            self._open.discard(key)
        elif not text:
            return
        else:
            self._open.add(key)
        self._emit(key[0], key[1], text, ends)

    def _scan(self, text: str) -> None:
        if (m := _FIRST_FAILED.search(text)) is not None:
            self._pending_rank = int(m.group(1))
        elif (m := _EXIT_CODE.search(text)) is not None and self._pending_rank is not None and self._said is None:
            self._said = Failure(self._pending_rank, f"exited with code {m.group(1)}")
        elif (m := _SIGNALLED.search(text)) is not None and self._said is None:
            name = f" ({m.group(4)})" if m.group(4) else ""
            self._said = Failure(int(m.group(1)), f"was killed by signal {m.group(3)}{name}", m.group(2))


def _may_be_this_machine(host: Host) -> bool:
    """Whether mpirun might take ``host`` for its own (then it starts those ranks itself)."""
    if is_local(host.ssh):
        return True
    name = bare_host(host.ssh)
    me = socket.gethostname().lower()
    if name in (me, me.split(".")[0]):   # mpirun also knows its own hostname, which is_local leaves to ssh
        return True
    try:
        mine = {a[4][0] for a in socket.getaddrinfo(me, None)}
    except OSError:
        mine = set()
    return name in mine


def mpirun_command(
    hosts: Sequence[Host],
    argv: Sequence[str],
    env: Mapping[str, str],
    token: str,
    cwd: Optional[str],
    mpi_args: Sequence[str],
    write_file: Callable[[str, str], str],
    exit_marker: Optional[str] = None,
) -> tuple[list[str], contract.MPIPlan, Optional[tuple[int, int]]]:
    """(full argv, plan, Open MPI's version: output rank-tagged; None: another MPI, untagged).

    The hostfile is written with ``write_file``. Start mpirun with ``plan.env`` in its
    environment: the command line names the variables to forward, never their values.
    With Open MPI and an ``exit_marker``, each rank reports its exit status under that marker.
    """
    mpirun = find_mpirun()
    version = open_mpi_version(mpirun)
    if version is not None:   # only Open MPI refuses root
        check_root({**os.environ, **env}, mpi_args)
    libname, libdir = find_libmpi()
    plan = contract.plan_mpi(hosts, env=env, token=token, libname=libname, libdir=libdir,
                             darwin=platform.system() == "Darwin", inherited=os.environ)
    hostfile = write_file("mpi-hostfile", plan.hostfile)
    cmd = [mpirun, "--hostfile", hostfile, "-np", str(plan.size)]
    if version is not None:   # other MPIs' mpirun take other flags: leave them as they are
        cmd.append("--tag-output")
        # Open MPI 4.1.4 (Debian 12) hangs with --stdin all as soon as a rank runs on
        # mpirun's own host (measured: even `echo hi | mpirun --stdin all -np 1 cat`);
        # there we keep its default, stdin to rank 0 only.
        user_stdin = any(a.split()[:1] in (["--stdin"], ["-stdin"]) for a in mpi_args)
        if not user_stdin and not any(_may_be_this_machine(h) for h in hosts):
            cmd += ["--stdin", "all"]
    if cwd:
        cmd += ["--wdir", cwd]
    # `-x NAME` forwards mpirun's own value (the launcher starts it with plan.env): a value
    # on its command line would be readable by every user of the host (ps, /proc/PID/cmdline)
    for key in plan.env:
        cmd += ["-x", key]
    for arg in mpi_args:
        try:
            cmd += shlex.split(arg)
        except ValueError as exc:
            raise LaunchError(f"--mpi-arg {arg!r}: {exc}") from None
    if version is not None and exit_marker:   # only tagged output tells whose the marker is
        argv = mpi_exits.reporting(argv, exit_marker)
    return [*cmd, "--", *argv], plan, version
