"""Rings (simple cycles) through a cable-count matrix, and the full-mesh check."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Iterator, Sequence

from .errors import PlanError

# Bound on DFS steps, so a pathological graph fails clearly instead of hanging.
MAX_STEPS = 2_000_000


@dataclass(frozen=True)
class Ring:
    """Hosts in ring order, and how many parallel cables every hop has at least."""

    nodes: tuple[int, ...]
    capacity: int

    def to_json(self) -> dict[str, Any]:
        return {"nodes": list(self.nodes), "cables": self.capacity}

    def hops(self) -> list[tuple[int, int]]:
        """(node, next node) pairs, including the closing hop (once for a 2-node ring)."""
        n = len(self.nodes)
        pairs = [(self.nodes[i], self.nodes[(i + 1) % n]) for i in range(n)]
        return pairs[:1] if n == 2 else pairs


def _cycles_from(matrix: Sequence[Sequence[int]], start: int, budget: list[int]) -> Iterator[list[int]]:
    """Cycles through `start` using only nodes above it, in depth-first order (lowest neighbour first)."""
    n = len(matrix)
    path = [start]
    on_path = {start}
    # iterative DFS: stack of neighbour iterators
    stack = [iter(range(n))]
    while stack:
        budget[0] -= 1
        if budget[0] < 0:
            raise PlanError("the cabling has too many cycles to enumerate; check the host list")
        node = path[-1]
        nxt = next(stack[-1], None)
        if nxt is None:
            stack.pop()
            on_path.discard(path.pop())
            continue
        if matrix[node][nxt] <= 0:
            continue
        if nxt == start and len(path) > 1:
            yield list(path)
        elif nxt > start and nxt not in on_path:
            path.append(nxt)
            on_path.add(nxt)
            stack.append(iter(range(n)))


def find_rings(matrix: Sequence[Sequence[int]]) -> list[Ring]:
    """Every ring, one per set of hosts, longest first (ties: order found; per set: most capacity)."""
    n = len(matrix)
    best: dict[frozenset[int], Ring] = {}
    order: list[frozenset[int]] = []
    budget = [MAX_STEPS]
    for start in range(n):
        for cycle in _cycles_from(matrix, start, budget):
            cap = min(matrix[cycle[i]][cycle[(i + 1) % len(cycle)]] for i in range(len(cycle)))
            key = frozenset(cycle)
            if key not in best:
                order.append(key)
                best[key] = Ring(tuple(cycle), cap)
            elif cap > best[key].capacity:
                best[key] = Ring(tuple(cycle), cap)
    return sorted((best[k] for k in order), key=lambda r: -len(r.nodes))


def full_ring(rings: list[Ring], n: int) -> Ring | None:
    """The first ring through all `n` hosts, if any."""
    return rings[0] if rings and len(rings[0].nodes) == n and n > 1 else None


def missing_pairs(matrix: Sequence[Sequence[int]]) -> list[tuple[int, int]]:
    """Host pairs (i < j) with no cable between them."""
    n = len(matrix)
    return [(i, j) for i in range(n) for j in range(i + 1, n) if matrix[i][j] <= 0 and matrix[j][i] <= 0]
