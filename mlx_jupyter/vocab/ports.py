"""Free TCP ports for local jobs: a block for MLX's ring and the same block
shifted by our core's offset (MLX_JUPYTER_PORT_OFFSET, else :func:`core_offset`).

Blocks are taken outside the OS's ephemeral range: a port free when chosen can
otherwise become the local port of some outgoing connection (the notebook's own,
to its controller) before the rank binds it ("Address already in use"). For the
same reason a block stays reserved in this process after it is returned: jobs
started one after another (a test's scenarios, two clusters) never share ports.
"""

from __future__ import annotations

import random
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Collection

#: IANA's ephemeral range, where neither /proc nor sysctl says otherwise
DEFAULT_EPHEMERAL = (49152, 65535)
LOWEST = 10000


class PortError(RuntimeError):
    """No free block of ports was found."""


def ephemeral_range() -> tuple[int, int]:
    """The range the OS takes outgoing connections' local ports from (inclusive)."""
    try:
        with open("/proc/sys/net/ipv4/ip_local_port_range") as fh:  # Linux
            lo, hi = (int(v) for v in fh.read().split())
            return lo, hi
    except (OSError, ValueError):
        pass
    if sys.platform == "darwin" or "bsd" in sys.platform:
        try:
            out = subprocess.run(["sysctl", "-n", "net.inet.ip.portrange.first", "net.inet.ip.portrange.last"],
                                 capture_output=True, text=True, timeout=2).stdout.split()
            return int(out[0]), int(out[1])
        except (OSError, ValueError, IndexError, subprocess.SubprocessError):
            pass
    return DEFAULT_EPHEMERAL


def block_starts(n: int, offset: int, ephemeral: tuple[int, int]) -> list[range]:
    """Ranges of starts P whose blocks P..P+n-1 and P+offset.. stay clear of ``ephemeral``."""
    lo, hi = ephemeral
    top = 65537 - offset - n  # exclusive bound on P (P + offset + n - 1 <= 65535)
    clear_below = range(LOWEST, min(top, lo - offset - n + 1))      # both blocks below lo
    clear_above = range(max(LOWEST, hi + 1), top)                   # both blocks above hi
    return [r for r in (clear_below, clear_above) if len(r) > 0]


#: The ring's first port when none is given (mlx.launch's ``--starting-port`` default).
DEFAULT_STARTING_PORT = 32323

#: NCCL's rendezvous port on rank 0's host when none is given (mlx.launch's ``--nccl-port`` default).
DEFAULT_NCCL_PORT = 12345

#: Our core binds each ring port + this offset (MLX_JUPYTER_PORT_OFFSET), beside MLX's own ring,
#: or - this offset where :func:`core_offset` says so.
CORE_PORT_OFFSET = 1000

#: Where Linux (32768-60999) and macOS (49152-65535) take outgoing connections' local ports by default.
#: A listening port in there can be taken by any outgoing connection on that host before the rank binds it.
OUTGOING_PORTS = (range(32768, 61000), range(49152, 65536))


def core_offset(ports: Collection[int]) -> int:
    """Our core's offset from MLX's ring ``ports`` when MLX_JUPYTER_PORT_OFFSET is unset: +1000, or -1000
    when only that keeps every shifted port clear of :data:`OUTGOING_PORTS` (MLX's default 32323 gives 31323)."""
    def clear(offset: int) -> bool:
        return not any(p + offset in r for p in ports for r in OUTGOING_PORTS)

    return -CORE_PORT_OFFSET if not clear(CORE_PORT_OFFSET) and clear(-CORE_PORT_OFFSET) else CORE_PORT_OFFSET


#: How long a returned block stays reserved in this process: its ranks bind it only once
#: started (seconds later on a loaded machine), and until then the bind check sees it free.
RESERVED_FOR_S = 600.0

_reserved: list[tuple[float, set[int]]] = []  # (when handed out, its ports)
_reserved_lock = threading.Lock()


def _reserve(ports: set[int]) -> bool:
    """Marks ``ports`` as handed out, unless a block handed out recently overlaps them."""
    now = time.monotonic()
    with _reserved_lock:
        _reserved[:] = [(t, p) for t, p in _reserved if now - t < RESERVED_FOR_S]
        if any(p & ports for _, p in _reserved):
            return False
        _reserved.append((now, ports))
        return True


def free_port_block(n: int, offset: int = CORE_PORT_OFFSET, host: str = "127.0.0.1", tries: int = 200) -> int:
    """A port P such that P..P+n-1 and P+offset..P+offset+n-1 are all free on ``host`` now,
    and overlap no block this process returned in the last RESERVED_FOR_S seconds."""
    ranges = block_starts(n, offset, ephemeral_range()) or [range(LOWEST, 65537 - offset - n)]
    weights = [len(r) for r in ranges]
    for _ in range(tries):
        start = random.choice(random.choices(ranges, weights)[0])
        if offset == CORE_PORT_OFFSET and core_offset(range(start, start + n)) != offset:
            continue  # the ranks would shift this block the other way (a macOS block up in Linux's range)
        block = {*range(start, start + n), *range(start + offset, start + offset + n)}
        socks = []
        try:
            for port in block:
                s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
                socks.append(s)
                s.bind((host, port))
        except OSError:
            continue
        finally:
            for s in socks:
                s.close()
        if _reserve(block):
            return start
    raise PortError(f"no block of {n} free ports (and +{offset}) found on {host}")
