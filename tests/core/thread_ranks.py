"""A world whose ranks are threads of this test process, each with its own CoreOptions."""

from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Callable, Optional, Sequence

from mlx_jupyter import _core
from mlx_jupyter.collective.group import CoreGroup
from mlx_jupyter.vocab.hosts import Address
from mlx_jupyter.vocab.ports import free_port_block


def in_threads(options: Sequence[_core.CoreOptions], body: Callable[[CoreGroup], Any], timeout: float,
               watch: Optional[Callable[[], Any]] = None) -> tuple[list[Any], Any]:
    """Forms a world of len(options) ranks (rank r a thread with options[r]), runs body(group) on each
    and, meanwhile, watch() in this thread; closes the world. Returns the bodies' results in rank
    order and watch()'s (None without one).

    A rank closes only once every rank's body has returned: close() aborts the group, which would
    fail a peer still finishing the last op. A body that raises releases the others at once."""
    n = len(options)
    base = free_port_block(n)
    addresses = [[Address("127.0.0.1", base + r)] for r in range(n)]
    finished = threading.Barrier(n)

    def rank(r: int) -> Any:
        group = CoreGroup(_core.Group.world(r, addresses, options[r], timeout), "ring", timeout)
        try:
            return body(group)
        except BaseException:
            finished.abort()
            raise
        finally:
            try:
                finished.wait(timeout)
            except threading.BrokenBarrierError:
                pass
            group.close("test over")

    with ThreadPoolExecutor(n) as pool:
        futures = [pool.submit(rank, r) for r in range(n)]
        seen = watch() if watch is not None else None
        return [f.result(timeout=2 * timeout) for f in futures], seen
