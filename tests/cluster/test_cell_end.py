"""A cell's end wakes whoever shows it: no poll on the path that ends a cell (it cost every cell 50 ms)."""

from __future__ import annotations

import threading
from types import SimpleNamespace

from mlx_jupyter.cluster.cells.display import Renderer, show_run
from mlx_jupyter.cluster.cells.run import FINISHED, CellRun


class LongPoll(CellRun):
    """A reader whose every wait would last 30 s: only an event can wake it in time."""

    def next_event(self, timeout: float):
        return super().next_event(30.0 if timeout else 0)


class SeenEnd(Renderer):
    def __init__(self, ranks: list[int]):
        self.lines: list[str] = []
        super().__init__(ranks, out=self.lines.append, err=self.lines.append, publish=lambda d, m: None)
        self.ended = threading.Event()

    def end(self, rank: int) -> None:
        super().end(rank)
        self.ended.set()


def _host(run_ended) -> SimpleNamespace:
    return SimpleNamespace(backend="ring", restart_advice="", dead={}, run_ended=run_ended,
                           send_abort=lambda reason, ranks, ids: {})


def test_the_reader_that_took_the_last_end_before_done_is_woken_when_the_run_finishes():
    """The last rank's end is queued before the run's bookkeeping (``run_ended``, which writes the
    panel's file) sets ``done``: the reader takes it, finds the run not done yet and waits again.
    The run's finish must wake it then, not leave it to its poll."""
    gate = threading.Event()
    run = LongPoll(_host(lambda run: gate.wait(10)), "x", [0])
    shown = SeenEnd([0])
    returned = threading.Event()
    reader = threading.Thread(target=lambda: (show_run(run, renderer=shown, live=None), returned.set()), daemon=True)
    reader.start()
    feeder = threading.Thread(target=run.channel_reply, args=(0, {"status": "ok"}), daemon=True)
    feeder.start()
    assert shown.ended.wait(10)   # the reader has the end; the run is held in run_ended
    assert not run.done.is_set()
    gate.set()
    assert returned.wait(10), "show_run slept on after the run finished"
    feeder.join(10)


def test_finished_is_the_runs_last_event_and_comes_with_done_set():
    run = CellRun(_host(lambda run: None), "x", [0, 1])
    run.channel_reply(1, {"status": "ok"})
    run.channel_reply(0, {"status": "ok"})
    kinds = []
    while (ev := run.next_event(0)) is not None:
        kinds.append((ev.kind, ev.rank))
    assert kinds == [("end", 1), ("end", 0), (FINISHED, -1)] and run.done.is_set()
