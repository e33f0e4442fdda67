"""Carriage returns on ranks: each rank's progress line is shown in place, with its rank label."""

from hypothesis import given, strategies as st

from mlx_jupyter.cluster.cells.display import Renderer
from mlx_jupyter.cluster.cells.text import LineGrouper, overwrite


def test_overwrite_is_what_a_terminal_shows():
    assert overwrite("step 1\rstep 2") == "step 2"
    assert overwrite("step 10\rstep 9") == "step 90"  # a shorter rewrite leaves the old tail, as a terminal does
    assert overwrite("abc\r") == "abc"  # CRLF and a pending \r change nothing yet


@given(st.text(alphabet="ab\r", max_size=30))
def test_overwrite_keeps_the_last_segment_in_front(line):
    shown = overwrite(line)
    last = line.split("\r")[-1]
    assert shown.startswith(last) and "\r" not in shown
    assert len(shown) == max((len(p) for p in line.split("\r")), default=0)


def test_the_prefix_survives_carriage_returns_and_the_last_value_ends_the_line():
    g = LineGrouper([0, 1], hold=10)
    for i in range(5):
        for r in (0, 1):
            g.feed(r, f"\rstep {i}", now=0)
    assert g.live() == {0: "step 4", 1: "step 4"}
    assert g.flush(now=0) == []  # nothing final yet
    g.finish(0, now=0)
    g.finish(1, now=0)
    assert g.live() == {}
    assert g.flush(now=0) == [([0, 1], "step 4")]


def test_a_pending_carriage_return_applies_to_the_next_chunk():
    g = LineGrouper([0], hold=0)
    g.feed(0, "loss 0.50\r", now=0)
    g.feed(0, "loss 0.4", now=0)
    assert g.live() == {0: "loss 0.40"}
    g.feed(0, "2\n", now=0)
    assert g.live() == {} and g.flush(now=0) == [([0], "loss 0.42")]


def test_plain_partial_lines_are_not_progress_lines():
    g = LineGrouper([0], hold=0)
    g.feed(0, "no newline yet", now=0)
    assert g.live() == {}


def _renderer(mode="grouped"):
    shown, out = [], []

    def show(handle, text):
        shown.append(text)
        return "handle"

    r = Renderer([0, 1], mode=mode, out=out.append, err=out.append, publish=lambda d, m: None, live=show)
    return r, shown, out


def test_renderer_shows_each_ranks_progress_in_one_display_updated_in_place():
    r, shown, out = _renderer()
    r.stream(0, "stderr", "\r 40%|####      | 2/5")
    r.stream(1, "stderr", "\r 20%|##        | 1/5")
    r.flush()
    assert shown[-1] == "[rank 0]  40%|####      | 2/5\n[rank 1]  20%|##        | 1/5"
    r.stream(1, "stderr", "\r 40%|####      | 2/5")
    r.flush()
    assert shown[-1] == "[ranks 0-1]  40%|####      | 2/5"
    for rank in (0, 1):
        r.stream(rank, "stderr", "\r100%|##########| 5/5\n")
    r.flush(force=True)
    assert shown[-1] == ""  # the display is cleared, the final line is ordinary output
    assert "".join(out) == "[ranks 0-1] 100%|##########| 5/5\n"


def test_rank_mode_keeps_one_row_per_rank():
    r, shown, _ = _renderer("rank")
    for rank in (0, 1):
        r.stream(rank, "stdout", "\rstep 3")
    r.flush()
    assert shown[-1] == "[rank 0] step 3\n[rank 1] step 3"


def test_no_display_is_made_for_output_without_carriage_returns():
    r, shown, out = _renderer()
    for rank in (0, 1):
        r.stream(rank, "stdout", "hello\n")
    r.flush(force=True)
    assert shown == [] and "".join(out) == "[ranks 0-1] hello\n"


def test_a_finished_bar_on_stderr_is_written_as_ordinary_output():
    """tqdm writes on stderr; its last line, once the bar ends, belongs with a success's output."""
    out, err = [], []
    r = Renderer([0, 1], out=out.append, err=err.append, publish=lambda d, m: None, live=lambda h, t: "h")
    for rank in (0, 1):
        r.stream(rank, "stderr", "steps:  50%|#  | 1/2\r")
        r.stream(rank, "stderr", "steps: 100%|###| 2/2\n")
        r.stream(rank, "stderr", "a warning\n")
        r.end(rank)
    r.flush(force=True)
    assert "".join(out) == "[ranks 0-1] steps: 100%|###| 2/2\n", out
    assert "".join(err) == "[ranks 0-1] a warning\n", err


def test_a_line_ending_in_crlf_is_no_bar():
    g = LineGrouper([0], hold=0)
    g.feed(0, "Traceback\r\n", now=0)
    assert [type(line) for _, line in g.flush(now=0)] == [str]
