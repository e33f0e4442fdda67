"""Pure parts of the output path: rank ranges, targets, line grouping, error rendering."""

import pytest

from mlx_jupyter.cluster.cells.outcome import DIED, ERROR, RELEASED, RankOutcome
from mlx_jupyter.cluster.cells.targets import parse_targets
from mlx_jupyter.cluster.cells.text import (
    LineGrouper, describe_exit, rank_label, rank_ranges, render_outcomes,
)


def test_rank_ranges_and_labels():
    assert rank_ranges([0, 1, 2, 3, 5, 7, 8]) == "0-3,5,7-8"
    assert rank_label([2]) == "rank 2"
    assert rank_label([3, 0, 1, 2]) == "ranks 0-3"


def test_parse_targets():
    assert parse_targets("all", 4) == [0, 1, 2, 3]
    assert parse_targets("0,2-3", 4) == [0, 2, 3]
    assert parse_targets(":2", 4) == [0, 1]
    with pytest.raises(ValueError, match="no rank 5"):
        parse_targets("5", 4)


def test_identical_lines_grouped_and_different_lines_per_rank():
    g = LineGrouper([0, 1], hold=10)
    g.feed(0, "hello\nrank 0\n", now=0)
    assert g.flush(now=0) == []  # rank 1 has not printed its first line yet
    g.feed(1, "hello\nrank 1\n", now=0)
    assert g.flush(now=0) == [([0, 1], "hello"), ([0], "rank 0"), ([1], "rank 1")]


def test_a_silent_rank_does_not_hold_output_forever():
    g = LineGrouper([0, 1], hold=0.25)
    g.feed(0, "only me\n", now=0)
    assert g.flush(now=0.1) == []
    assert g.flush(now=0.3) == [([0], "only me")]


def test_finished_rank_releases_partial_line():
    g = LineGrouper([0, 1], hold=10)
    g.feed(0, "no newline", now=0)
    g.finish(0, now=0)
    g.finish(1, now=0)
    assert g.flush(now=0) == [([0], "no newline")]


def test_describe_exit():
    assert describe_exit(-11) == "killed by SIGSEGV"
    assert "out of memory" in describe_exit(-9)
    assert describe_exit(3) == "exit code 3"


def test_render_outcomes_names_every_rank():
    outs = [
        RankOutcome(0, RELEASED, "AbortedError", "aborted", note="stopped (AbortedError) because rank 1 raised"),
        RankOutcome(1, ERROR, "ZeroDivisionError", "division by zero", ["Traceback", "ZeroDivisionError"]),
        RankOutcome(2, ERROR, "ZeroDivisionError", "division by zero", ["Traceback", "ZeroDivisionError"]),
        RankOutcome(3, DIED, note="process died (killed by SIGKILL)"),
    ]
    text = "\n".join(render_outcomes(outs))
    assert "ranks 1-2: ZeroDivisionError" in text and text.count("Traceback") == 1
    assert "rank 0: stopped" in text and "rank 3: process died" in text


def test_mlx_ring_errors_are_held_and_folded_to_one_line_per_rank():
    from mlx_jupyter.cluster.cells.display import Renderer

    out, err = [], []
    r = Renderer([0, 1], out=out.append, err=err.append, publish=lambda d, m: None)
    r.stream(0, "stderr", "[ring] Socket 5 was closed by the peer\n" * 10)
    r.stream(0, "stderr", "[ring] Too many send/recv errors. Failing pending tasks...\nreal problem\n")
    r.end(0)
    r.end(1)
    r.flush(force=True)
    assert "".join(err) == "[rank 0] real problem\n", err  # nothing of MLX's noise on the way
    assert r.folded_noise() == ["[rank 0] [ring] Socket 5 was closed by the peer "
                                "(and 10 more MLX ring socket errors like it)"]
    assert r.folded_noise() == []


def test_a_rank_that_cannot_be_released_under_mpi_is_told_to_restart():
    from types import SimpleNamespace

    from mlx_jupyter.cluster.cells.run import CellRun

    advice = "restart the ranks: %mlx_cluster restart"  # the cluster's, as it works where the note is shown
    mpi = CellRun(SimpleNamespace(backend="mpi", restart_advice=advice), "x", [0])._no_reply_note()
    assert "blocked mpi collective, which cannot be cancelled; restart the ranks: %mlx_cluster restart" in mpi
    ring = CellRun(SimpleNamespace(backend="ring", restart_advice=advice), "x", [0])._no_reply_note()
    assert "interrupt again, or restart the ranks: %mlx_cluster restart" in ring


def test_a_peer_that_stopped_responding_is_given_up_on_naming_its_host():
    """Rank 0's PeerError says rank 2's host stopped answering: rank 2 is aborted, and, silent, given
    up on after the release deadline as lost on its host; the cell's cause names rank and host."""
    from types import SimpleNamespace

    from mlx_jupyter.cluster.cells.outcome import NO_REPLY
    from mlx_jupyter.cluster.cells.run import CellRun

    aborted = []
    host = SimpleNamespace(backend="ring", restart_advice="restart the ranks: %mlx_cluster restart",
                           rank_infos=lambda: [SimpleNamespace(host=f"node{r + 1}") for r in range(3)],
                           send_abort=lambda reason, ranks, ids, drain=False: aborted.append(list(ranks)) or {},
                           drain=lambda ranks, msg_ids, on_busy=None: None,
                           run_ended=lambda run: None)
    run = CellRun(host, "x", [0, 1, 2], release_deadline=2.0)
    peer = {"status": "error", "ename": "PeerError",
            "evalue": "rank 2 (10.201.7.13:21005) stopped responding (its host is down or the network is cut): "
                      "nothing was acknowledged for 2.000 s (MLX_JUPYTER_DEAD_PEER_TIMEOUT)"}
    for rank in (0, 1):
        run.channel_reply(rank, peer)
    assert run.outcomes[0].status == RELEASED and aborted == [[1, 2]]   # every rank still running
    assert run.cause == "rank 2 on node3 stopped responding (its host is down or the network is cut)"
    run.check_deadlines(now=run._abort_sent[2] + 2.0)
    assert run.done.is_set() and run.outcomes[2].status == NO_REPLY
    assert run.outcomes[2].note.startswith("lost: node3 stopped responding")


def test_a_peer_error_about_a_rank_that_already_ended_aborts_nothing():
    from types import SimpleNamespace

    from mlx_jupyter.cluster.cells.run import CellRun

    aborted = []
    host = SimpleNamespace(backend="ring", restart_advice="", rank_infos=lambda: [],
                           send_abort=lambda reason, ranks, ids: aborted.append(list(ranks)) or {},
                           run_ended=lambda run: None)
    run = CellRun(host, "x", [0, 1])
    run.channel_reply(1, {"status": "ok"})
    run.channel_reply(0, {"status": "error", "ename": "PeerError", "evalue": "rank 1 (10.0.0.2:1) stopped responding"})
    assert aborted == [] and run.cause is None and run.done.is_set()


def test_a_run_through_a_controller_that_died_ends_every_rank_still_running_naming_it():
    from types import SimpleNamespace

    from mlx_jupyter.cluster.cells.outcome import NO_REPLY, OK
    from mlx_jupyter.cluster.cells.run import CellRun

    lost = []
    host = SimpleNamespace(backend="ring", restart_advice="", run_ended=lambda run: None,
                           controller_lost=lambda: lost[0] if lost else "")
    run = CellRun(host, "x", [0, 1])
    run.via = "controller"
    run.channel_reply(0, {"status": "ok"})
    run.check_deadlines(now=1000.0)
    assert not run.done.is_set()
    lost.append("the cluster's controller (pid 7) is dead (killed by SIGKILL); restart the cluster")
    run.check_deadlines(now=1000.1)
    assert not run.done.is_set(), "asked again before CONTROLLER_LOOK"
    run.check_deadlines(now=1001.0)
    assert run.done.is_set() and run.cause == lost[0]
    assert run.outcomes[0].status == OK and run.outcomes[1].status == NO_REPLY
    assert "controller" in run.outcomes[1].note
