"""What a rank reads from its environment (MLX_RANK, MLX_HOSTFILE, as MLX's ring reads them): its rank and the ring
hostfile, validated with errors that name the variable, the file and the fix."""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from typing import Mapping

from mlx_jupyter.hostfile import parse_ring_hostfile
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


def parse_hostfile(text: str, path: str) -> list[list[tuple[str, int]]]:
    """The MLX ring hostfile: a JSON list with one list of "ip:port" per rank (read by
    :func:`mlx_jupyter.hostfile.parse_ring_hostfile`); errors name the file."""
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise RankEnvError(f"{path} is not valid JSON ({exc.msg} at line {exc.lineno} column {exc.colno}); "
                           "expected a list with one list of \"ip:port\" strings per rank") from None
    try:
        return parse_ring_hostfile(data)
    except ValueError as exc:
        raise RankEnvError(f"{path}: {exc}") from None


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
