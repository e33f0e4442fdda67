"""What a rank reads from its environment (MLX_RANK, MLX_HOSTFILE, as MLX's ring reads them): its rank and the ring
hostfile, validated with errors that name the variable, the file and the fix."""

from __future__ import annotations

import ipaddress
import json
import os
from dataclasses import dataclass
from typing import Mapping

from mlx_jupyter.net.hosts import format_addr
from mlx_jupyter.net.ports import CORE_PORT_OFFSET

DEFAULT_PORT_OFFSET = CORE_PORT_OFFSET


class RankEnvError(ValueError):
    """The environment does not describe a valid ring rank."""


@dataclass(frozen=True)
class RingEnv:
    rank: int
    addresses: list[list[str]]  # per rank, the "ip:port" our core listens on
    source: str  # where the addresses came from, for messages


def parse_address(text: object, where: str) -> tuple[str, int]:
    """Splits "ip:port" (IPv6 as "[::1]:port"); raises RankEnvError naming `where`."""
    if not isinstance(text, str) or ":" not in text:
        raise RankEnvError(f"{where}: {text!r} is not an \"ip:port\" string")
    host, _, port = text.rpartition(":")
    host = host[1:-1] if host.startswith("[") and host.endswith("]") else host
    if not host or any(c.isspace() for c in host):
        raise RankEnvError(f"{where}: {text!r} has no valid host")
    if not port.isdigit() or not 1 <= int(port) <= 65535:
        raise RankEnvError(f"{where}: {text!r} has a port outside 1..65535")
    try:
        ipaddress.ip_address(host)
    except ValueError:
        if not all(part and (part.isalnum() or "-" in part) for part in host.split(".")):
            raise RankEnvError(f"{where}: {text!r} has an invalid host {host!r}") from None
    return host, int(port)


def parse_hostfile(text: str, path: str) -> list[list[tuple[str, int]]]:
    """The MLX ring hostfile: a JSON list with one list of "ip:port" per rank."""
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise RankEnvError(f"{path} is not valid JSON ({exc.msg} at line {exc.lineno} column {exc.colno}); "
                           "expected a list with one list of \"ip:port\" strings per rank") from None
    if not isinstance(data, list) or not data:
        raise RankEnvError(f"{path}: expected a non-empty JSON list with one entry per rank, got {type(data).__name__}")
    rows = []
    for rank, row in enumerate(data):
        if isinstance(row, str):
            row = [row]
        if not isinstance(row, list) or not row:
            raise RankEnvError(f"{path}: entry {rank} (rank {rank}) must be a non-empty list of \"ip:port\" strings")
        rows.append([parse_address(a, f"{path}: rank {rank}") for a in row])
    return rows


def read_ring_env(env: Mapping[str, str] | None = None) -> RingEnv | None:
    """The ring settings of this process, or None when it was not launched as a ring rank.

    Our core listens on MLX_JUPYTER_HOSTFILE's addresses when set, otherwise on
    MLX_HOSTFILE's with every port shifted by MLX_JUPYTER_PORT_OFFSET (default
    1000), so that MLX's own ring can use the hostfile's ports in the same process."""
    env = os.environ if env is None else env
    ours = env.get("MLX_JUPYTER_HOSTFILE")
    var = "MLX_JUPYTER_HOSTFILE" if ours else "MLX_HOSTFILE"
    path = ours or env.get("MLX_HOSTFILE")
    rank_text = env.get("MLX_RANK", env.get("JACCL_RANK"))
    if not path and rank_text is None:
        return None
    if rank_text is None:
        raise RankEnvError(f"{var} is set but MLX_RANK is not: set MLX_RANK to this process's 0-based rank")
    try:
        rank = int(rank_text)
    except ValueError:
        raise RankEnvError(f"MLX_RANK={rank_text!r} is not an integer") from None
    if not path:
        if rank == 0:
            return RingEnv(0, [[]], "MLX_RANK=0 without a hostfile (a single rank)")
        raise RankEnvError(f"MLX_RANK={rank} but MLX_HOSTFILE is not set: point it at the ring hostfile")
    try:
        with open(path, encoding="utf-8") as fh:
            text = fh.read()
    except OSError as exc:
        raise RankEnvError(f"{var}={path}: cannot read the hostfile ({exc.strerror})") from None
    rows = parse_hostfile(text, path)
    if not 0 <= rank < len(rows):
        raise RankEnvError(f"MLX_RANK={rank} is out of range: {path} lists {len(rows)} rank(s), 0..{len(rows) - 1}")
    offset = 0
    if not ours:
        offset_text = env.get("MLX_JUPYTER_PORT_OFFSET", str(DEFAULT_PORT_OFFSET))
        try:
            offset = int(offset_text)
        except ValueError:
            raise RankEnvError(f"MLX_JUPYTER_PORT_OFFSET={offset_text!r} is not an integer") from None
    addresses = []
    for r, row in enumerate(rows):
        shifted = []
        for host, port in row:
            p = port + offset
            if not 1 <= p <= 65535:
                raise RankEnvError(f"{path}: rank {r} port {port} + MLX_JUPYTER_PORT_OFFSET {offset} is outside "
                                   "1..65535; choose another offset or starting port")
            shifted.append(format_addr(host, p))
        addresses.append(shifted)
    return RingEnv(rank, addresses, f"{var}={path}")
