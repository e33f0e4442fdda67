"""A cell's unfinished lines shown as they come (issue 43 §1), through the renderer a cell's display uses."""

from __future__ import annotations

from mlx_jupyter.cluster.cells.display import Renderer


def _renderer(ranks=(0, 1), hold=10.0, mode="grouped", partial_hold=0.0):
    out, err, shown = [], [], []
    r = Renderer(list(ranks), mode, hold=hold, out=out.append, err=err.append,
                 publish=lambda data, meta: shown.append(data), live=lambda handle, text: None,
                 partial_hold=partial_hold)
    return r, out, err, shown


def _feed(r, rank, text, stream="stdout"):
    r.stream(rank, stream, text)
    r.flush()


def test_a_ranks_tokens_grow_one_line_shown_before_its_newline():
    r, out, _, _ = _renderer()
    _feed(r, 0, "streamed")
    assert "".join(out) == "[rank 0] streamed"
    _feed(r, 0, " tokens")
    assert "".join(out) == "[rank 0] streamed tokens"
    _feed(r, 0, " end\n")   # the line waits for rank 1 (hold), its start is out already
    r.end(1)
    r.flush()
    assert "".join(out) == "[rank 0] streamed tokens end\n"


def test_identical_tokens_of_several_ranks_show_once_as_far_as_all_wrote():
    r, out, _, _ = _renderer()
    r.stream(0, "stdout", "The")
    _feed(r, 1, "The")
    _feed(r, 0, " answer")
    assert "".join(out) == "[ranks 0-1] The"
    _feed(r, 1, " answer")
    r.stream(0, "stdout", "\n")
    _feed(r, 1, "\n")
    assert "".join(out) == "[ranks 0-1] The answer\n"


def test_another_ranks_text_breaks_the_line_and_the_rest_comes_labelled():
    r, out, _, _ = _renderer()
    _feed(r, 0, "a")
    _feed(r, 1, "x")
    _feed(r, 0, " b")
    r.stream(0, "stdout", "\n")
    r.stream(1, "stdout", "\n")
    r.flush(force=True)
    assert "".join(out) == "[rank 0] a\n[rank 1] x\n[rank 0]  b\n"   # rank 1's line was all shown before its break


def test_a_line_broken_after_its_last_piece_adds_no_empty_line():
    r, out, _, _ = _renderer(ranks=(0, 1), hold=0.0)
    _feed(r, 0, "a")
    _feed(r, 1, "x")
    assert "".join(out) == "[rank 0] a\n[rank 1] x"
    _feed(r, 0, "\n")   # rank 0's line was all shown: its newline shows nothing more
    _feed(r, 1, "\n")
    assert "".join(out) == "[rank 0] a\n[rank 1] x\n"


def test_the_other_stream_and_a_display_break_the_line():
    r, out, err, shown = _renderer(ranks=(0,), hold=0.0)
    _feed(r, 0, "loading")
    _feed(r, 0, "warning\n", "stderr")
    assert ("".join(out), "".join(err)) == ("[rank 0] loading\n", "[rank 0] warning\n")
    _feed(r, 0, " done")
    r.rich(0, {"data": {"image/png": "x"}, "metadata": {}})
    r.flush()
    assert "".join(out) == "[rank 0] loading\n[rank 0]  done\n[rank 0]\n" and len(shown) == 1


def test_rank_mode_streams_each_rank_apart():
    r, out, _, _ = _renderer(mode="rank")
    r.stream(0, "stdout", "same")
    _feed(r, 1, "same")
    assert "".join(out) == "[rank 0] same\n[rank 1] same"


def test_a_line_shown_in_part_waits_for_no_other_rank_and_whole_lines_still_group():
    r, out, _, _ = _renderer(hold=10.0)
    _feed(r, 0, "a")
    _feed(r, 0, "\n")                      # its start is out: the line ends now, not after the hold
    _feed(r, 0, "b")                       # so the next line's tokens show at once
    assert "".join(out) == "[rank 0] a\n[rank 0] b"
    r.stream(0, "stdout", "\nsame\n")
    _feed(r, 1, "same\n")                  # lines align by position: rank 1's first meets rank 0's "b"
    r.end(0)
    r.end(1)
    r.flush()
    assert "".join(out) == "[rank 0] a\n[rank 0] b\n[rank 1] same\n[rank 0] same\n"



def test_a_line_shown_in_part_is_finished_alone_and_the_ranks_that_showed_none_of_it_group():
    """Rank 2's stalled "after" was shown; when every rank's line completes together, rank 2's is continued
    and the others group, so no rank's line shows twice (a fresh clone once showed "[rank 2] after" and then
    "[ranks 0-2] after")."""
    r, out, _, _ = _renderer(ranks=(0, 1, 2, 3), hold=10.0)
    _feed(r, 2, "after")
    assert "".join(out) == "[rank 2] after"
    for rank in (0, 1, 3):
        r.stream(rank, "stdout", "after\n")
    _feed(r, 2, "\n")
    assert "".join(out) == "[rank 2] after\n[ranks 0-1,3] after\n"


def test_a_group_that_showed_part_of_a_line_continues_it_and_the_rest_come_whole():
    r, out, _, _ = _renderer(ranks=(0, 1, 2), hold=10.0)
    r.stream(0, "stdout", "the")
    _feed(r, 1, "the")
    assert "".join(out) == "[ranks 0-1] the"
    r.stream(2, "stdout", "the end\n")
    r.stream(0, "stdout", " end\n")
    r.stream(1, "stdout", " end\n")
    r.flush()
    assert "".join(out) == "[ranks 0-1] the end\n[rank 2] the end\n"


def test_a_fresh_unfinished_line_waits_its_hold_so_a_print_split_in_two_messages_still_groups():
    r, out, _, _ = _renderer(hold=10.0, partial_hold=60.0)
    _feed(r, 0, "after")                   # print's text; its newline comes in the next message
    assert "".join(out) == ""
    r.stream(1, "stdout", "after\n")
    _feed(r, 0, "\n")
    assert "".join(out) == "[ranks 0-1] after\n"


def test_an_unfinished_line_shows_once_its_hold_passed():
    r, out, _, _ = _renderer(ranks=(0,), partial_hold=0.0)
    g = r.streams["stdout"]
    g.feed(0, "slow", now=100.0)
    assert g.partials(now=100.04, age=0.05) == {} and g.partials(now=100.06, age=0.05) == {0: "slow"}
    g.feed(0, " token", now=101.0)         # more of the same line keeps its start's time
    assert g.partials(now=101.0, age=0.05) == {0: "slow token"}
    g.feed(0, "\nnext", now=102.0)         # a new line's start is timed anew
    g.flush(now=102.0, force=True)
    assert g.partials(now=102.04, age=0.05) == {} and g.partials(now=102.0, age=0.05, started={0}) == {0: "next"}


def test_a_figure_waits_a_second_for_the_alike_figures_of_ranks_that_make_them():
    from mlx_jupyter.cluster.cells.display import DISPLAY_HOLD, Displays

    fig = {"data": {"image/png": "same"}, "metadata": {}}
    d = Displays([0, 1], hold=0.25)
    d.feed(1, fig, now=10.0)
    assert d.flush(now=10.0 + DISPLAY_HOLD - 0.01) == []          # the cell's first: rank 0 may be late (load)
    d.feed(0, fig, now=10.6)
    assert d.flush(now=10.6) == [([0, 1], fig)]
    d.feed(0, {"data": {"text/html": "only 0"}, "metadata": {}}, now=20.0)
    assert d.flush(now=20.0 + DISPLAY_HOLD - 0.01) == []          # rank 1 made one before: it may make this too
    assert d.flush(now=20.0 + DISPLAY_HOLD + 0.01) == [([0], {"data": {"text/html": "only 0"}, "metadata": {}})]


def test_a_rank_that_makes_no_figures_is_waited_for_only_the_short_hold():
    from mlx_jupyter.cluster.cells.display import Displays

    d = Displays([0, 1], hold=0.25)   # rank 0 plots, rank 1 never does (`if rank == 0: plot`)
    d.feed(0, {"data": {"image/png": "0"}, "metadata": {}}, now=10.0)
    assert d.flush(now=10.9) == []               # the first waits DISPLAY_HOLD (rank 1 might make one)
    assert d.flush(now=11.01) == [([0], {"data": {"image/png": "0"}, "metadata": {}})]
    d.feed(0, {"data": {"image/png": "1"}, "metadata": {}}, now=12.0)
    assert d.flush(now=12.2) == []
    assert d.flush(now=12.26) == [([0], {"data": {"image/png": "1"}, "metadata": {}})]   # then only the hold
