"""Free TCP ports for local jobs: a block for MLX's ring and the same block
shifted by our core's offset (MLX_JUPYTER_PORT_OFFSET, 1000)."""

from __future__ import annotations

import random
import socket


class PortError(RuntimeError):
    """No free block of ports was found."""


def free_port_block(n: int, offset: int = 1000, host: str = "127.0.0.1", tries: int = 200) -> int:
    """A port P such that P..P+n-1 and P+offset..P+offset+n-1 are all free on ``host`` now."""
    for _ in range(tries):
        start = random.randrange(20000, 60000 - offset - n)
        socks = []
        try:
            for port in [*range(start, start + n), *range(start + offset, start + offset + n)]:
                s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
                socks.append(s)
                s.bind((host, port))
        except OSError:
            continue
        finally:
            for s in socks:
                s.close()
        return start
    raise PortError(f"no block of {n} free ports (and +{offset}) found on {host}")
