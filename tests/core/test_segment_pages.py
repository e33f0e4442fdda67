"""Shared memory is mapped with every page present: no op pays for faulting in its ring (issue 23)."""

from __future__ import annotations

import sys

import numpy as np
import pytest

from mlx_jupyter import _core
from tests.core.thread_ranks import in_threads

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc/self/smaps")


def _memfd_mappings() -> list[tuple[int, int]]:
    """(Size, Rss) in kB of each of this process's mappings of our memfd segments."""
    found, current = [], None
    with open("/proc/self/smaps") as fh:
        for line in fh:
            first = line.split(maxsplit=1)[0]
            if "-" in first and not first.endswith(":"):   # a mapping's header line
                current = [0, 0] if "memfd:mlx_jupyter" in line else None
                if current is not None:
                    found.append(current)
            elif current is not None and first in ("Size:", "Rss:"):
                current[0 if first == "Size:" else 1] = int(line.split()[1])
    return [tuple(m) for m in found]


def test_ring_pages_are_present_before_the_first_op():
    def mapped(group):
        group.barrier()   # the world is formed: its links' segments are mapped on both sides
        return _memfd_mappings()

    (rank0, _), _ = in_threads([_core.CoreOptions(token="t")] * 2, mapped, timeout=20)
    rings = [(size, rss) for size, rss in rank0 if size >= 1024]   # the 2 x 4 MiB rings, not small boards
    assert rings, f"no memfd ring mapping found in /proc/self/smaps: {rank0}"
    for size, rss in rings:
        assert rss == size, f"a ring mapping of {size} kB has only {rss} kB present: pages left to fault during ops"


def test_results_unchanged_with_populated_rings():
    def summed(group):
        x = np.arange(1024, dtype=np.float32) * (group.rank() + 1)
        out = np.empty_like(x)
        for _ in range(2000):   # more than one trip round the 4 MiB ring
            group.all_reduce("sum", x, out, None)
        return out

    results, _ = in_threads([_core.CoreOptions(token="t")] * 2, summed, timeout=20)
    want = np.arange(1024, dtype=np.float32) * 3
    for out in results:
        np.testing.assert_array_equal(out, want)
