"""The environment contract per backend: hosts in, per-rank env vars and file payloads out.

Pure. A launcher writes each ``files`` payload to a temp file on the rank's
host and sets the named variable to its path, as MLX's own launcher does
(``MLX_HOSTFILE``, ``MLX_IBV_DEVICES``). The variables' names, and the reader a
rank uses, are :mod:`mlx_jupyter.vocab.rank_env`.
"""

from __future__ import annotations

import json
from collections import Counter
from dataclasses import dataclass, field
from typing import Mapping, Sequence

from mlx_jupyter.vocab.backends import RECORDS, find
from mlx_jupyter.vocab.hosts import format_addr
from mlx_jupyter.hostfile import Host, HostfileError, RdmaEntry, ring_ports
from mlx_jupyter.vocab import rank_env
from mlx_jupyter.vocab.ports import DEFAULT_NCCL_PORT, DEFAULT_STARTING_PORT, core_offset

#: MLX's nccl takes its bootstrap timeout in ms in an int: "wait" (-1, inf) is the largest it holds
_NCCL_WAIT_MS = 2**31 - 1


class ContractError(ValueError):
    """The hosts cannot satisfy a backend's contract; the message says which host and why."""


@dataclass
class RankPlan:
    """What one rank receives: its host, env vars, and files (var name -> content)."""

    rank: int
    host: Host
    env: dict[str, str] = field(default_factory=dict)
    files: dict[str, str] = field(default_factory=dict)


@dataclass
class MPIPlan:
    """An ``mpirun`` launch: its ``host slots=k`` hostfile, the env forwarded by name with ``-x``, each rank's host."""

    hostfile: str
    env: dict[str, str]
    size: int
    rank_hosts: list[str] = field(default_factory=list)   # Open MPI's default placement: fill each host's slots


def _local_index(hosts: Sequence[Host], rank: int) -> int:
    """How many earlier ranks share this rank's host (its local/GPU index)."""
    return sum(1 for h in hosts[:rank] if h.ssh == hosts[rank].ssh)


def _need_rank0_ip(hosts: Sequence[Host], backend: str) -> str:
    if not hosts[0].ips:
        raise ContractError(
            f"{backend}: rank 0 (host {hosts[0].ssh!r}) needs an IP that every rank can reach; "
            "add \"ips\" to its hostfile entry or list it by IP"
        )
    return hosts[0].ips[0]


def check_rdma(hosts: Sequence[Host], ring: bool) -> list[list[RdmaEntry]]:
    """Validate the ``rdma`` matrix (n x n, null diagonal, a device for every needed pair)."""
    n = len(hosts)
    names = [h.ssh for h in hosts]
    if len(set(names)) != n:
        raise ContractError("jaccl runs one rank per host: a host is listed twice (drop -n or the duplicate entry)")
    for i, h in enumerate(hosts):
        if len(h.rdma) != n:
            raise ContractError(
                f"jaccl: host {h.ssh!r} (rank {i}) lists {len(h.rdma)} RDMA devices in 'rdma' but there are "
                f"{n} hosts; it needs one entry per host (null for itself)"
            )
        if h.rdma[i] is not None:
            raise ContractError(f"jaccl: host {h.ssh!r} (rank {i}): rdma[{i}] must be null (a host has no link to itself)")
    missing = [
        (i, j)
        for i, h in enumerate(hosts)
        for j in (sorted({(i - 1) % n, (i + 1) % n}) if ring else range(n))
        if i != j and h.rdma[j] is None
    ]
    if missing:
        pairs = ", ".join(f"{names[i]} -> {names[j]}" for i, j in missing[:4])
        more = f" and {len(missing) - 4} more" if len(missing) > 4 else ""
        raise ContractError(f"jaccl: no RDMA device listed for {pairs}{more}; run `mlx-jupyter config` to rebuild the hostfile")
    return [list(h.rdma) for h in hosts]


def plan_ranks(
    backend: str,
    hosts: Sequence[Host],
    *,
    env: Mapping[str, str] | None = None,
    token: str | None = None,
    starting_port: int = DEFAULT_STARTING_PORT,
    connections_per_ip: int = 1,
    nccl_port: int = DEFAULT_NCCL_PORT,
    verbose: bool = False,
    coordinator: bool = True,
) -> list[RankPlan]:
    """Per-rank env and files for ``backend`` (ring, jaccl, jaccl-ring, nccl).

    jaccl: ``coordinator=False`` opens no bootstrap port (no ``MLX_JACCL_COORDINATOR``): JACCL then
    bootstraps over our core's ring (``MLX_JUPYTER_HOSTFILE``, planned whenever every host has an IP;
    without one, the coordinator is set after all)."""
    record = find(backend)
    if record is None or record.mpirun:
        valid = ", ".join(b.name for b in RECORDS if not b.mpirun)
        raise ContractError(f"backend {backend!r}: plan_ranks handles {valid} (mpi goes through plan_mpi)")
    if not hosts:
        raise ContractError("no hosts to launch on")
    n = len(hosts)
    common: dict[str, str] = dict(env or {})
    if token is not None:
        common.update(rank_env.variables(token=token))
    files: dict[str, str] = {}
    per_rank: list[dict[str, str]] = [{} for _ in hosts]

    if record.contract == "ring":
        try:
            plan = ring_ports(hosts, starting_port, connections_per_ip)
        except HostfileError as exc:
            raise ContractError(f"ring: {exc}") from None
        # MLX's ring cannot form a group of one (it dials itself and waits
        # forever): with a single rank we leave MLX_HOSTFILE unset so that
        # init() falls back to a singleton group at once.
        if n > 1:
            files[rank_env.HOSTFILE] = json.dumps(plan)
        if verbose:
            common[rank_env.RING_VERBOSE] = "1"
    elif record.contract == "jaccl":
        ip = _need_rank0_ip(hosts, backend)
        matrix = check_rdma(hosts, record.rdma == "neighbours") if n > 1 else [[None]]
        if coordinator:
            common[rank_env.JACCL_COORDINATOR] = format_addr(ip, starting_port)
        common.update(record.mlx_env)   # jaccl-ring: MLX_JACCL_RING=1
        files["MLX_IBV_DEVICES"] = json.dumps(matrix)
        core = _core_ring(hosts, starting_port, connections_per_ip)
        if core:  # our core's signed ring: JACCL's bootstrap can run over it (core.side_channel)
            files[rank_env.OWN_HOSTFILE] = core
        elif not coordinator and n > 1:  # a host without an IP: no core ring, so MLX's coordinator after all
            common[rank_env.JACCL_COORDINATOR] = format_addr(ip, starting_port)
    elif record.contract == "nccl":
        common[rank_env.NCCL_HOST_IP] = _need_rank0_ip(hosts, backend)
        common["NCCL_PORT"] = str(nccl_port)
        common[rank_env.WORLD_SIZE] = str(n)
        common.setdefault(rank_env.NCCL_TIMEOUT, nccl_timeout_ms(common.get(rank_env.CONNECT_TIMEOUT)))
        if verbose:
            common.setdefault("NCCL_DEBUG", "INFO")
        for r in range(n):
            per_rank[r]["CUDA_VISIBLE_DEVICES"] = str(_local_index(hosts, r))

    return [
        RankPlan(r, hosts[r], {**common, **per_rank[r], rank_env.RANK: str(r)}, dict(files))
        for r in range(n)
    ]


def _core_ring(hosts: Sequence[Host], starting_port: int, connections_per_ip: int) -> str:
    """Our core's own ring hostfile (MLX's ports shifted by :func:`core_offset`), or "" when a host has no IP."""
    if len(hosts) < 2 or any(not h.ips for h in hosts):
        return ""
    try:
        count = sum(len(h.ips) for h in hosts) * connections_per_ip  # MLX's: one port each from starting_port
        offset = core_offset(range(starting_port, starting_port + count))
        plan = ring_ports(hosts, starting_port + offset, connections_per_ip)
    except HostfileError:
        return ""
    return json.dumps(plan)


def nccl_timeout_ms(connect_timeout: str | None) -> str:
    """MLX_NCCL_TIMEOUT for our connect timeout (seconds as MLX_JUPYTER_CONNECT_TIMEOUT writes it; default 120 s)."""
    seconds = 120.0
    if connect_timeout:
        try:
            seconds = float(connect_timeout)
        except ValueError:
            raise ContractError(f"{rank_env.CONNECT_TIMEOUT}={connect_timeout!r} is not a number of seconds") from None
    if seconds < 0 or seconds * 1000 >= _NCCL_WAIT_MS or seconds != seconds:
        return str(_NCCL_WAIT_MS)
    return str(max(1, int(seconds * 1000)))


def plan_mpi(
    hosts: Sequence[Host],
    *,
    env: Mapping[str, str] | None = None,
    token: str | None = None,
    libname: str | None = None,
    libdir: str | None = None,
    darwin: bool = False,
    inherited: Mapping[str, str] | None = None,
) -> MPIPlan:
    """The ``mpirun`` hostfile (``[user@]host slots=k``, in first-seen order) and exported env.

    ``libdir`` is prepended to the library search path: to ``env``'s value if
    it sets one, else to ``inherited``'s (the launcher's environment).
    """
    if not hosts:
        raise ContractError("no hosts to launch on")
    slots = Counter("localhost" if h.is_local else h.ssh for h in hosts)
    text = "".join(f"{h} slots={k}\n" for h, k in slots.items())
    out: dict[str, str] = {}
    if libname:
        out[rank_env.MPI_LIBNAME] = libname
    out.update(env or {})
    if libdir:
        var = "DYLD_LIBRARY_PATH" if darwin else "LD_LIBRARY_PATH"
        rest = out.get(var, (inherited or {}).get(var, ""))
        out[var] = ":".join([libdir, *(p for p in rest.split(":") if p and p != libdir)])
    if token is not None:
        out.update(rank_env.variables(token=token))
    return MPIPlan(text, out, len(hosts), [h for h, k in slots.items() for _ in range(k)])
