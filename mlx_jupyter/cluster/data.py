"""Cluster data movement and rank namespaces: setup of mx/world/group, re-forming, push/pull/scatter/gather."""

from __future__ import annotations

from typing import Any, Mapping, Optional, Sequence

from mlx_jupyter.cluster.shared.errors import ClusterError


class Data:
    """Part of :class:`~mlx_jupyter.cluster.handle.Cluster`: what moves between the notebook and the ranks."""

    def setup(self, world: bool = True, group: bool = True, timeout: float = 60.0) -> dict[int, dict]:
        """Define ``mx``, ``world`` and ``group`` on every rank (all at once: the ring forms)."""
        from mlx_jupyter.cluster.rank import world as rank_world

        self.check_ranks(self.ranks)
        view = self.client.direct_view(targets=self.ranks)
        ar = view.apply_async(rank_world.setup, self.backend, world, group, timeout)
        infos = self.wait(ar, timeout + 5, self.ranks, "setup of mx/world/group")
        self.setup_info = dict(zip(self.ranks, infos))
        self.ready_ns = True
        self.needs_reform = False
        return self.setup_info

    def reform(self, timeout: float = 10.0, attempts: int = 2) -> dict[int, dict]:
        """Form our core's ``group`` afresh on every rank (after an abort); retried once."""
        for attempt in range(attempts):
            try:
                return self._reform(timeout)
            except ClusterError:
                if attempt + 1 == attempts:
                    raise
        raise AssertionError("unreachable")

    def _reform(self, timeout: float) -> dict[int, dict]:
        from mlx_jupyter.cluster.rank import world as rank_world

        self.check_ranks(self.ranks)
        view = self.client.direct_view(targets=self.ranks)
        ar = view.apply_async(rank_world.reform, timeout)
        infos = self.wait(ar, timeout + 5, self.ranks, "re-forming group")
        for r, info in zip(self.ranks, infos):
            self.setup_info.setdefault(r, {}).update(info)
        errors = {r: i["group_error"] for r, i in zip(self.ranks, infos) if i.get("group_error")}
        if errors:
            raise ClusterError("re-forming `group` failed: " + "; ".join(f"rank {r}: {e}" for r, e in errors.items()))
        self.needs_reform = False
        return self.setup_info

    def push(self, ns: Mapping[str, Any], targets: Optional[Sequence[int]] = None, timeout: float = 60.0) -> None:
        """Define the names of ``ns`` in every target rank's namespace."""
        ranks = list(self.ranks if targets is None else targets)
        self.check_ranks(ranks)
        ar = self.client.direct_view(targets=ranks).push(dict(ns), block=False)
        self.wait(ar, timeout, ranks, "push")

    def pull(self, names: str | Sequence[str], targets: Optional[Sequence[int]] = None,
             timeout: float = 60.0) -> list[Any]:
        """The value(s) of ``names`` on each target rank, in rank order."""
        ranks = list(self.ranks if targets is None else targets)
        self.check_ranks(ranks)
        ar = self.client.direct_view(targets=ranks).pull(names, block=False)
        out = self.wait(ar, timeout, ranks, "pull")
        return list(out) if len(ranks) > 1 or isinstance(out, list) else [out]

    def scatter(self, name: str, seq: Any, targets: Optional[Sequence[int]] = None, timeout: float = 60.0) -> None:
        """Split ``seq`` into consecutive parts, part r bound to ``name`` on rank r."""
        ranks = list(self.ranks if targets is None else targets)
        self.check_ranks(ranks)
        ar = self.client.direct_view(targets=ranks).scatter(name, seq, block=False)
        self.wait(ar, timeout, ranks, "scatter")

    def gather(self, name: str, targets: Optional[Sequence[int]] = None, timeout: float = 60.0) -> Any:
        """Concatenate ``name`` from every rank, in rank order."""
        ranks = list(self.ranks if targets is None else targets)
        self.check_ranks(ranks)
        ar = self.client.direct_view(targets=ranks).gather(name, block=False)
        return self.wait(ar, timeout, ranks, "gather")
