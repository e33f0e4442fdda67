"""The rank's environment, both ways: every variable's name, the writer launchers use
(:func:`variables`), and the one reader, :func:`read`, a pure function of the environment
that validates every variable once into a :class:`RankEnv`.

MLX's own contract (``MLX_RANK``, ``MLX_HOSTFILE`` ...) is read here too: our core listens
on the ring hostfile's addresses shifted by ``MLX_JUPYTER_PORT_OFFSET``. :func:`load_ring`
reads that hostfile (the one step that opens a file).
"""

from __future__ import annotations

import json
import math
import os
from dataclasses import dataclass, field, fields
from typing import Callable, Mapping, Optional

from mlx_jupyter.vocab.hosts import Address, split_addr
from mlx_jupyter.vocab.ports import core_offset

# MLX's contract (mlx.launch sets these; MLX and our core read them)
RANK = "MLX_RANK"
JACCL_RANK = "JACCL_RANK"
HOSTFILE = "MLX_HOSTFILE"
RING_VERBOSE = "MLX_RING_VERBOSE"
WORLD_SIZE = "MLX_WORLD_SIZE"
NCCL_HOST_IP = "NCCL_HOST_IP"
JACCL_COORDINATOR = "MLX_JACCL_COORDINATOR"
#: JACCL reads each setting under two names; the first (JACCL_*) wins when both are set, as in MLX
JACCL_RANKS = (JACCL_RANK, RANK)
JACCL_DEVICES = ("JACCL_IBV_DEVICES", "MLX_IBV_DEVICES")
JACCL_COORDINATORS = ("JACCL_COORDINATOR", JACCL_COORDINATOR)
JACCL_RINGS = ("JACCL_RING", "MLX_JACCL_RING")
NCCL_TIMEOUT = "MLX_NCCL_TIMEOUT"            # ms a nccl rank retries reaching rank 0 (MLX's default 300000)
MPI_LIBNAME = "MLX_MPI_LIBNAME"              # the MPI library MLX loads (the backend probe tries it first)
#: where other launchers put a process's rank, after MLX's (MPI, PMIx, Slurm)
OTHER_RANKS = ("OMPI_COMM_WORLD_RANK", "PMI_RANK", "PMIX_RANK", "SLURM_PROCID")

# Ours: the core (read by distributed.init into the core's CoreOptions)
TOKEN = "MLX_JUPYTER_TOKEN"                  # the job's secret; peers prove they hold it
OWN_HOSTFILE = "MLX_JUPYTER_HOSTFILE"        # our core's own ring hostfile (no port offset)
PORT_OFFSET = "MLX_JUPYTER_PORT_OFFSET"      # added to MLX_HOSTFILE's ports (default: ports.core_offset)
TIMEOUT = "MLX_JUPYTER_TIMEOUT"              # seconds an op may block (-1 or unset: wait)
CONNECT_TIMEOUT = "MLX_JUPYTER_CONNECT_TIMEOUT"    # seconds init() waits for its peers (120)
DEAD_PEER_TIMEOUT = "MLX_JUPYTER_DEAD_PEER_TIMEOUT"  # seconds a silent host counts as alive (10)
TRANSPORT = "MLX_JUPYTER_TRANSPORT"          # auto (shared memory on one host) or tcp
SHM = "MLX_JUPYTER_SHM"                      # named: macOS's POSIX objects on Linux too (tests)
BOARD = "MLX_JUPYTER_BOARD"                  # 0: small ops of a one-host group take the ring
HOST_ID = "MLX_JUPYTER_HOST_ID"              # fakes this machine's identity (tests: several "hosts")
VERBOSE = "MLX_JUPYTER_VERBOSE"              # log connections (as MLX_RING_VERBOSE)
# Ours: the cluster's ranks (set by the engine-set launcher and the Cluster)
BACKEND = "MLX_JUPYTER_BACKEND"
SIZE = "MLX_JUPYTER_SIZE"
EARLY_WORLD = "MLX_JUPYTER_EARLY_WORLD"      # 0: MLX's world forms with the first cell, not at start
CELL_PORT = "MLX_JUPYTER_CELL_PORT"          # the notebook's cell channel (absent or 0: none)
#: read in the notebook, not on ranks: 0 sends cells through the controller instead
CELL_CHANNEL = "MLX_JUPYTER_CELL_CHANNEL"

#: what a launcher sets for each rank itself, with why: a value given with --env, ``env=`` or a hostfile's
#: envs would be overwritten, so it is refused where it is given
LAUNCHER_SETS: dict[str, str] = {
    RANK: "the launcher numbers the ranks 0 to n-1",
    HOSTFILE: "the launcher writes each launch's ring hostfile (give the hosts with --hosts or --hostfile)",
    WORLD_SIZE: "the launcher counts the ranks",
    NCCL_HOST_IP: "the launcher takes rank 0's address from the hosts",
    "NCCL_PORT": "the launcher sets it from --nccl-port (use that)",
    JACCL_COORDINATOR: "the launcher takes rank 0's address and --starting-port",
    "MLX_IBV_DEVICES": "the launcher writes it from the hostfile's rdma entries",
    TOKEN: "each launch makes its own secret",
    OWN_HOSTFILE: "the launcher writes our core's ring hostfile",
}

TRANSPORTS = ("auto", "tcp")
SHM_MECHANISMS = ("auto", "named")
#: the longest a dead-peer timeout may be, in seconds (a day)
MAX_DEAD_PEER = 86400.0


class RankEnvError(ValueError):
    """The environment does not describe a valid rank; the message names the variable and the fix."""


@dataclass(frozen=True)
class RankEnv:
    """Everything a rank reads from its environment, validated (see the variables above)."""

    rank: Optional[int] = None        # JACCL_RANK, else MLX_RANK (JACCL's order): the ring's rank; None when unset
    process_rank: int = 0             # the first rank any launcher set (MLX, JACCL, MPI, Slurm), else 0
    launched: bool = False            # MLX_RANK, MLX_HOSTFILE, JACCL_RANK or a JACCL device file set: a
                                      # single-rank fallback would be wrong
    hostfile: str = ""                # the ring hostfile our core reads ("" when none)
    hostfile_var: str = HOSTFILE      # the variable that named it
    port_offset: Optional[int] = None  # added to its ports (0 for MLX_JUPYTER_HOSTFILE; None: core_offset's)
    mlx_hostfile: str = ""            # MLX_HOSTFILE itself: MLX's own ring
    launchers: tuple[str, ...] = ()   # MLX backends whose launch environment is present: nccl, mpi, jaccl
    mpi_libname: str = ""
    token: str = ""
    verbose: bool = False
    timeout: float = -1.0
    connect_timeout: float = 120.0
    dead_peer_timeout: float = 10.0
    transport: str = "auto"
    shm: str = "auto"
    board: bool = True
    host_id: str = ""
    backend: str = ""
    size: int = 1
    early_world: bool = True
    cell_port: Optional[int] = None
    jaccl: "JacclEnv" = field(default_factory=lambda: JacclEnv())

    @property
    def ring_configured(self) -> bool:
        """Whether this process was started as a ring rank (a rank or a ring hostfile is set)."""
        return self.rank is not None or bool(self.hostfile)


@dataclass(frozen=True)
class JacclEnv:
    """What MLX's JACCL reads, each from the first of its two names that is set (JACCL_* wins)."""

    devices: str = ""                 # the device matrix file (JACCL_IBV_DEVICES / MLX_IBV_DEVICES)
    devices_var: str = ""
    coordinator: str = ""             # ip:port of rank 0's bootstrap socket ("" : none)
    coordinator_var: str = ""
    ring: bool = False                # JACCL_RING / MLX_JACCL_RING set: prefer a ring over a mesh

    @property
    def configured(self) -> bool:
        """Launched for JACCL: a device file or a coordinator is set (the coordinator is optional in MLX)."""
        return bool(self.devices or self.coordinator)


@dataclass(frozen=True)
class RingEnv:
    """Our core's ring: this rank and, per rank, the addresses our core listens on."""

    rank: int
    addresses: list[list[Address]]
    source: str  # where the addresses came from, for messages


def check_seconds(value: float, what: str) -> float:
    """The one rule for a timeout: seconds >= 0, inf (or huge) for no deadline, -1 to wait; NaN and
    other negatives are errors naming ``what``."""
    if math.isnan(value) or (value < 0 and value != -1):
        raise ValueError(f"{what} must be >= 0 seconds (or -1 to wait), got {value}")
    return float(value)


def _text(env: Mapping[str, str], var: str) -> str:
    return env.get(var) or ""


def _seconds(env: Mapping[str, str], var: str, default: float) -> float:
    text = _text(env, var)
    if not text:
        return default
    try:
        value = float(text)
    except ValueError:
        raise RankEnvError(f"{var}={text!r} is not a number of seconds; set a number such as 30, or unset it") from None
    try:
        return check_seconds(value, f"{var}={text!r}")
    except ValueError as exc:
        raise RankEnvError(f"{exc}; unset it for the default") from None


def _int(env: Mapping[str, str], var: str, default: Optional[int], low: int, high: int) -> Optional[int]:
    text = _text(env, var).strip()
    if not text:
        return default
    try:
        value = int(text)
    except ValueError:
        raise RankEnvError(f"{var}={text!r} is not an integer; set one in {low}..{high}, or unset it") from None
    if not low <= value <= high:
        raise RankEnvError(f"{var}={value} is outside {low}..{high}; set one in that range, or unset it")
    return value


def _choice(env: Mapping[str, str], var: str, choices: tuple[str, ...]) -> str:
    text = _text(env, var) or choices[0]
    if text not in choices:
        raise RankEnvError(f"{var}={text!r} is not one of {', '.join(choices)}; set one of them, or unset it")
    return text


def _switch(env: Mapping[str, str], var: str) -> bool:
    """A switch that is on unless set to 0."""
    text = _text(env, var)
    if text not in ("", "0", "1"):
        raise RankEnvError(f"{var}={text!r}: set 0 (off) or 1 (on), or unset it (on)")
    return text != "0"


def first_set(env: Mapping[str, str], names: tuple[str, ...]) -> tuple[str, str]:
    """(variable, value) of the first of ``names`` set in ``env`` (JACCL's rule: the first name wins), else ("", "")."""
    for var in names:
        if env.get(var) is not None:
            return var, env[var]
    return "", ""


def _jaccl(env: Mapping[str, str]) -> JacclEnv:
    devices_var, devices = first_set(env, JACCL_DEVICES)
    coordinator_var, coordinator = first_set(env, JACCL_COORDINATORS)
    return JacclEnv(devices, devices_var if devices else "", coordinator, coordinator_var if coordinator else "",
                    bool(first_set(env, JACCL_RINGS)[0]))


def _rank(env: Mapping[str, str]) -> Optional[int]:
    var, text = first_set(env, JACCL_RANKS)
    if not var:
        return None
    try:
        value = int(text)
    except ValueError:
        raise RankEnvError(f"{var}={text!r} is not an integer; set this process's 0-based rank") from None
    if value < 0:
        raise RankEnvError(f"{var}={value} is negative; set this process's 0-based rank")
    return value


def _process_rank(env: Mapping[str, str], ring_rank: Optional[int]) -> int:
    if ring_rank is not None:
        return ring_rank
    for var in OTHER_RANKS:
        if _text(env, var):
            return _int(env, var, 0, 0, 1 << 30) or 0
    return 0


def _launchers(env: Mapping[str, str]) -> tuple[str, ...]:
    found = []
    if _text(env, WORLD_SIZE) and _text(env, NCCL_HOST_IP):
        found.append("nccl")
    # mpirun -n 1 (or a lone PMI process) is no distributed group: MLX skips an MPI world of one too
    if _mpi_size(env) > 1:
        found.append("mpi")
    if _jaccl(env).configured:
        found.append("jaccl")
    return tuple(found)


def _mpi_size(env: Mapping[str, str]) -> int:
    for var in ("OMPI_COMM_WORLD_SIZE", "PMI_SIZE"):
        text = _text(env, var).strip()
        if text:
            return int(text) if text.isdigit() else 2   # a garbled size is still an MPI launch: let MPI say
    return 0


def read(env: Mapping[str, str]) -> RankEnv:
    """The rank's settings from ``env`` (a mapping such as ``os.environ``), every variable checked.

    Pure: the ring hostfile is only named here; :func:`load_ring` reads it."""
    own = _text(env, OWN_HOSTFILE)
    rank = _rank(env)
    jaccl = _jaccl(env)
    cell_port = _int(env, CELL_PORT, 0, 0, 65535)
    return RankEnv(
        rank=rank,
        process_rank=_process_rank(env, rank),
        launched=bool(_text(env, RANK) or _text(env, HOSTFILE) or _text(env, JACCL_RANK) or jaccl.devices),
        hostfile=own or _text(env, HOSTFILE),
        hostfile_var=OWN_HOSTFILE if own else HOSTFILE,
        port_offset=0 if own else _int(env, PORT_OFFSET, None, -65535, 65535),
        mlx_hostfile=_text(env, HOSTFILE),
        launchers=_launchers(env),
        mpi_libname=_text(env, MPI_LIBNAME),
        token=_text(env, TOKEN),
        verbose=bool(_text(env, RING_VERBOSE) or _text(env, VERBOSE)),
        timeout=_seconds(env, TIMEOUT, -1.0),
        connect_timeout=_seconds(env, CONNECT_TIMEOUT, 120.0),
        dead_peer_timeout=_dead_peer(env),
        transport=_choice(env, TRANSPORT, TRANSPORTS),
        shm=_choice(env, SHM, SHM_MECHANISMS),
        board=_switch(env, BOARD),
        host_id=_text(env, HOST_ID),
        backend=_text(env, BACKEND),
        size=_int(env, SIZE, 1, 1, 1 << 20) or 1,
        early_world=_switch(env, EARLY_WORLD),
        cell_port=cell_port or None,
        jaccl=jaccl,
    )


def _dead_peer(env: Mapping[str, str]) -> float:
    value = _seconds(env, DEAD_PEER_TIMEOUT, 10.0)
    if not 0 < value <= MAX_DEAD_PEER:
        raise RankEnvError(f"{DEAD_PEER_TIMEOUT}={_text(env, DEAD_PEER_TIMEOUT)!r} must be a number of seconds in "
                           f"(0, {MAX_DEAD_PEER:g}]; unset it for the default (10)")
    return value


def current() -> RankEnv:
    """:func:`read` of this process's environment."""
    return read(os.environ)


#: RankEnv field -> (variable, how its value is written), for :func:`variables`
_WRITTEN: dict[str, tuple[str, Callable[[object], str]]] = {
    "token": (TOKEN, str),
    "timeout": (TIMEOUT, repr),
    "connect_timeout": (CONNECT_TIMEOUT, repr),
    "dead_peer_timeout": (DEAD_PEER_TIMEOUT, repr),
    "transport": (TRANSPORT, str),
    "shm": (SHM, str),
    "board": (BOARD, lambda on: "1" if on else "0"),
    "host_id": (HOST_ID, str),
    "backend": (BACKEND, str),
    "size": (SIZE, str),
    "early_world": (EARLY_WORLD, lambda on: "1" if on else "0"),
    "cell_port": (CELL_PORT, lambda port: str(port or 0)),
}


def variables(**settings: object) -> dict[str, str]:
    """The environment variables that make :func:`read` return ``settings`` (RankEnv field names).

    The writer's half of the contract: ``variables(backend="ring", size=4)`` ->
    ``{"MLX_JUPYTER_BACKEND": "ring", "MLX_JUPYTER_SIZE": "4"}``."""
    unknown = set(settings) - set(_WRITTEN)
    if unknown:
        known = {f.name for f in fields(RankEnv)}
        kind = "not written by launchers" if unknown <= known else "not RankEnv fields"
        raise TypeError(f"{sorted(unknown)}: {kind}; writable are {', '.join(sorted(_WRITTEN))}")
    return {_WRITTEN[name][0]: _WRITTEN[name][1](value) for name, value in settings.items()}


def parse_ring_hostfile(text: str, source: str) -> list[list[Address]]:
    """The ring hostfile MLX reads from ``MLX_HOSTFILE``: a JSON list with, per rank, a list of
    ``"ip:port"`` (or one such string); RankEnvError naming ``source`` and the rank otherwise."""
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise RankEnvError(f"{source} is not valid JSON ({exc.msg} at line {exc.lineno} column {exc.colno}); "
                           "expected a list with one list of \"ip:port\" strings per rank") from None
    if not isinstance(data, list) or not data:
        raise RankEnvError(f"{source}: expected a non-empty JSON list with one entry per rank, "
                           f"got {type(data).__name__ if data else data!r}")
    rows = []
    for rank, row in enumerate(data):
        row = [row] if isinstance(row, str) else row
        if not isinstance(row, list) or not row:
            raise RankEnvError(f"{source}: entry {rank} (rank {rank}) must be a non-empty list of \"ip:port\" strings")
        try:
            rows.append([split_addr(a) for a in row])
        except ValueError as exc:
            raise RankEnvError(f"{source}: rank {rank}: {exc}") from None
    return rows


def _read_text(path: str) -> str:
    with open(path, encoding="utf-8") as fh:
        return fh.read()


def load_ring(env: RankEnv, read_text: Callable[[str], str] = _read_text) -> Optional[RingEnv]:
    """Our core's ring from the hostfile ``env`` names (read with ``read_text``), or None when this
    process is not a ring rank. Ports are shifted by ``env.port_offset`` (unset: :func:`core_offset`), so
    that MLX's own ring can use the hostfile's ports in the same process."""
    if not env.ring_configured:
        return None
    var, path = env.hostfile_var, env.hostfile
    if env.rank is None:
        raise RankEnvError(f"{var} is set but {RANK} is not: set {RANK} to this process's 0-based rank")
    if not path:
        if env.rank == 0:
            return RingEnv(0, [[]], f"{RANK}=0 without a hostfile (a single rank)")
        raise RankEnvError(f"{RANK}={env.rank} but {HOSTFILE} is not set: point it at the ring hostfile")
    try:
        text = read_text(path)
    except OSError as exc:
        raise RankEnvError(f"{var}={path}: cannot read the hostfile ({exc.strerror or exc})") from None
    rows = parse_ring_hostfile(text, path)
    if env.rank >= len(rows):
        raise RankEnvError(f"{RANK}={env.rank} is out of range: {path} lists {len(rows)} rank(s), 0..{len(rows) - 1}")
    offset = env.port_offset if env.port_offset is not None else core_offset([p for row in rows for _, p in row])
    addresses = []
    for r, row in enumerate(rows):
        shifted = []
        for host, port in row:
            if not 1 <= port + offset <= 65535:
                raise RankEnvError(f"{path}: rank {r} port {port} + {PORT_OFFSET} {offset} is outside "
                                   "1..65535; choose another offset or starting port")
            shifted.append(Address(host, port + offset))
        addresses.append(shifted)
    return RingEnv(env.rank, addresses, f"{var}={path}")
