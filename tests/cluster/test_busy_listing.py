"""The panel's running/idle listing is written only for cells that last, off the cell's path."""

from __future__ import annotations

import threading
from types import SimpleNamespace

from mlx_jupyter.cluster.busy_listing import BusyListing


class Written:
    """The busy lists published, in order, with a bounded wait for the n-th."""

    def __init__(self) -> None:
        self.lists: list[list[int]] = []
        self.cond = threading.Condition()

    def __call__(self, busy) -> None:
        with self.cond:
            self.lists.append(list(busy))
            self.cond.notify_all()

    def wait_for(self, n: int) -> list[list[int]]:
        with self.cond:
            assert self.cond.wait_for(lambda: len(self.lists) >= n, timeout=10), self.lists
            return list(self.lists)


def test_a_cell_that_ends_before_the_delay_writes_nothing():
    written = Written()
    listing = BusyListing(written, delay=3600)
    for _ in range(3):
        run = SimpleNamespace(ranks=[0, 1])
        listing.started(run)
        listing.ended(run)
    listing.close()
    assert written.lists == [] and listing.writes == 0


def test_a_cell_that_lasts_is_listed_running_then_idle():
    written = Written()
    listing = BusyListing(written, delay=0)
    run = SimpleNamespace(ranks=[1])
    listing.started(run)
    assert written.wait_for(1) == [[1]]
    listing.ended(run)
    assert written.wait_for(2) == [[1], []]
    listing.close()


def test_two_cells_on_different_ranks_are_listed_together():
    written = Written()
    listing = BusyListing(written, delay=0)
    a, b = SimpleNamespace(ranks=[0]), SimpleNamespace(ranks=[2, 3])
    listing.started(a)
    written.wait_for(1)
    listing.started(b)
    assert written.wait_for(2)[-1] == [0, 2, 3]
    listing.ended(a)
    assert written.wait_for(3)[-1] == [2, 3]
    listing.close()


def test_nothing_is_written_once_closed():
    """The cluster's file is removed right after close(): a late write would list a stopped cluster."""
    written = Written()
    listing = BusyListing(written, delay=0)
    listing.close()
    listing.started(SimpleNamespace(ranks=[0]))
    assert listing._thread is None and written.lists == []


def test_a_failing_write_does_not_stop_the_listing():
    calls = Written()

    def publish(busy) -> None:
        calls(busy)
        if len(calls.lists) == 1:
            raise OSError("read-only runtime dir")

    listing = BusyListing(publish, delay=0)
    run = SimpleNamespace(ranks=[0])
    listing.started(run)
    calls.wait_for(1)
    listing.ended(run)
    assert calls.wait_for(2) == [[0], []]
    listing.close()


def test_a_cell_after_the_thread_fell_asleep_is_still_listed(monkeypatch):
    """While cells come the thread looks by itself (a cell's start wakes nothing); after IDLE s
    without one it sleeps for good, and the next cell wakes it."""
    import mlx_jupyter.cluster.busy_listing as busy_listing

    monkeypatch.setattr(busy_listing, "IDLE", 0.0)
    written = Written()
    listing = BusyListing(written, delay=0)
    first = SimpleNamespace(ranks=[0])
    listing.started(first)
    written.wait_for(1)
    listing.ended(first)
    written.wait_for(2)
    with listing._cond:
        assert listing._cond.wait_for(lambda: listing._asleep, timeout=10)
    second = SimpleNamespace(ranks=[1])
    listing.started(second)
    assert written.wait_for(3)[-1] == [1]
    listing.close()
