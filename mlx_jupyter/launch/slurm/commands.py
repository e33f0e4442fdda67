"""Slurm's client commands, run with a timeout each; their output read with :mod:`.parse`.

Blocking calls (``subprocess.run``): asyncio callers run them in a thread.
Slurm finds its controller through its usual configuration (``SLURM_CONF``,
/etc/slurm), taken from this process's environment.
"""

from __future__ import annotations

import ipaddress
import socket
import subprocess
from typing import Optional, Sequence

from mlx_jupyter.launch.errors import LaunchError
from mlx_jupyter.launch.slurm.parse import (SINFO_FORMAT, SQUEUE_FORMAT, JobState, NodeInfo, SlurmOutputError,
                                           parse_hostnames, parse_job_id, parse_sinfo_line, parse_squeue_line)

#: Seconds any one Slurm command may take (slurmctld answers in milliseconds; a busy one in seconds).
TIMEOUT = 30.0


class SlurmError(LaunchError):
    """A Slurm command failed or printed what we cannot read; the message names the command and the fix."""


def run(argv: Sequence[str], timeout: Optional[float] = None) -> str:
    """``argv``'s stdout; :class:`SlurmError` naming the command on failure, timeout (default
    :data:`TIMEOUT`, read at each call) or absence."""
    name = " ".join(argv[:3] if argv[0] == "scontrol" else argv[:1])
    timeout = TIMEOUT if timeout is None else timeout
    try:
        res = subprocess.run(list(argv), capture_output=True, text=True, timeout=timeout, stdin=subprocess.DEVNULL)
    except FileNotFoundError:
        raise SlurmError(f"{argv[0]} not found: --slurm needs Slurm's client commands on PATH "
                         "(Debian/Ubuntu: apt-get install slurm-client), on a machine that can reach slurmctld") from None
    except subprocess.TimeoutExpired:
        raise SlurmError(f"{name} did not answer within {timeout:g} s: is slurmctld reachable from here "
                         "(`scontrol ping`; SLURM_CONF)?") from None
    if res.returncode != 0:
        why = res.stderr.strip() or res.stdout.strip() or f"exit status {res.returncode}"
        raise SlurmError(f"{name} failed: {why}")
    return res.stdout


def hostnames(nodelist: str) -> list[str]:
    """A hostlist expression (``node[1-4,7]``) expanded by Slurm itself, in its order."""
    try:
        return parse_hostnames(run(["scontrol", "show", "hostnames", nodelist]))
    except SlurmOutputError as exc:
        raise SlurmError(f"node list {nodelist!r}: {exc}") from None


def nodes_info(nodes: Sequence[str]) -> dict[str, NodeInfo]:
    """Address and state of each of ``nodes`` (sinfo lists a node once per partition: kept once)."""
    out = run(["sinfo", "--noheader", "--Node", "--nodes", ",".join(nodes), "--format", SINFO_FORMAT])
    info: dict[str, NodeInfo] = {}
    for line in out.splitlines():
        if line.strip():
            try:
                node = parse_sinfo_line(line)
            except SlurmOutputError as exc:
                raise SlurmError(str(exc)) from None
            info.setdefault(node.name, node)
    missing = [n for n in nodes if n not in info]
    if missing:
        raise SlurmError(f"sinfo does not list node(s) {', '.join(missing)}")
    return info


def node_ip(node: NodeInfo) -> str:
    """The node's address as an IP (NodeAddr, resolved here when it is a name); prefers IPv4."""
    try:
        return str(ipaddress.ip_address(node.addr))
    except ValueError:
        pass
    try:
        infos = socket.getaddrinfo(node.addr, None, type=socket.SOCK_STREAM)
    except OSError as exc:
        raise SlurmError(f"node {node.name}: cannot resolve its address {node.addr!r} ({exc.strerror or exc}); "
                         "the ring backend needs each node's IP") from None
    addrs = sorted({str(i[4][0]) for i in infos}, key=lambda a: (":" in a, a))
    return addrs[0]


def mpi_plugin() -> str:
    """The PMI plugin srun starts MPI ranks with: pmix if this Slurm has it, else pmi2."""
    out = run(["srun", "--mpi=list"])
    types = {w.strip() for line in out.splitlines() if line[:1].isspace() for w in line.split()}
    for name in ("pmix", "pmi2"):
        if name in types:
            return name
    raise SlurmError("the mpi backend under Slurm needs srun's pmix or pmi2 plugin, and this Slurm lists "
                     f"{', '.join(sorted(types)) or 'none'} (srun --mpi=list); choose one with --srun-arg=--mpi=TYPE")


def job_state(job_id: int) -> Optional[JobState]:
    """The job as squeue shows it (finished ones too, while slurmctld keeps them); None once forgotten."""
    try:
        out = run(["squeue", "--noheader", "--states=all", f"--jobs={job_id}", f"--format={SQUEUE_FORMAT}"])
    except SlurmError as exc:
        if "Invalid job id" in str(exc):
            return None
        raise
    for line in out.splitlines():
        if line.strip():
            try:
                state = parse_squeue_line(line)
            except SlurmOutputError as exc:
                raise SlurmError(str(exc)) from None
            if state.job_id == job_id:
                return state
    return None


def submit(argv: Sequence[str]) -> int:
    """Run ``sbatch --parsable ...``; the new job's id."""
    out = run(argv)
    try:
        return parse_job_id(out)
    except SlurmOutputError as exc:
        raise SlurmError(str(exc)) from None


def cancel(target: str, signal: Optional[str] = None, timeout: Optional[float] = None) -> bool:
    """``scancel`` a job or step (``123``, ``123.0``), or send it ``signal`` (``INT``, ``TERM``...);
    False if scancel failed (the job had already ended, slurmctld did not answer)."""
    argv = ["scancel", "--quiet", *([f"--signal={signal}"] if signal else []), "--", target]
    try:
        run(argv, timeout)
    except SlurmError:
        return False
    return True
