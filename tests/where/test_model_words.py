"""where's words, exactly: sizes, rank lists, pdb and timeout phrases, places, the table and the diagnosis."""

from __future__ import annotations

import pytest

from mlx_jupyter.where.model import (RankRow, Where, debugger_state, diagnosis, format_bytes, html_table, place_of, rows,
                                     rank_words, text_table, timeout_words, waits_on_peer, bundle)


@pytest.mark.parametrize("n, text", [(None, "?"), (0, "0 B"), (1023, "1023 B"), (1024, "1.0 KB"), (1536, "1.5 KB"),
                                     (1024 ** 2 - 1, "1024.0 KB"), (1024 ** 2, "1.0 MB"), (1024 ** 3, "1.0 GB"),
                                     (1024 ** 4, "1024.0 GB")])
def test_format_bytes(n, text):
    assert format_bytes(n) == text


def test_rank_words():
    assert rank_words([2]) == "rank 2" and rank_words([2, 0]) == "ranks 0 and 2"
    assert rank_words([3, 0, 1]) == "ranks 0, 1 and 3"


def test_debugger_and_timeout_words():
    assert debugger_state({"line": 4}) == "in pdb (line 4)"
    assert debugger_state({"line": 3, "func": "scale", "post_mortem": True}) == "in pdb post-mortem (line 3 in scale)"
    assert debugger_state({"func": "<module>"}) == "in pdb (line ?)"
    mlx = "no timeout (MLX's collectives have none; the stop button ends the wait)"
    assert timeout_words(None) == mlx and timeout_words({"group": "mlx-ring", "timeout": 3}) == mlx
    assert timeout_words({"timeout": 2.5}) == "times out after 2.5 s" and timeout_words({"timeout": 30.0}) == "times out after 30 s"
    unset = "no timeout set (timeout= or MLX_JUPYTER_TIMEOUT; the stop button ends the wait)"
    assert timeout_words({}) == unset and timeout_words({"timeout": "30", "group": "core"}) == unset


@pytest.mark.parametrize("sample, place", [
    ({}, ("running", "")),
    ({"call": "f"}, ("running in f", "")),
    ({"line": 4}, ("at line 4", "at line 4")),
    ({"line": 4, "call": "f"}, ("at line 4 in f", "at line 4")),
    ({"line": 4, "call": "dist.all_sum"}, ("in all_sum at line 4", "in all_sum at line 4")),
    ({"call": "core.barrier"}, ("in barrier", "in barrier")),
    ({"line": 2, "call": "mx.eval"}, ("in mx.eval at line 2", "in mx.eval at line 2")),
    ({"line": 2, "call": "mx.distributed.all_sum"}, ("in mx.distributed.all_sum at line 2",) * 2),
    ({"line": 2, "call": "dist.helper"}, ("at line 2 in dist.helper", "at line 2")),
    ({"line": 2, "call": "np.all_sum"}, ("at line 2 in np.all_sum", "at line 2")),
    ({"line": 5, "activity": [{"state": "done", "op": "all_gather"}, {"state": "waiting", "op": ""},
                              {"state": "running", "op": "all_sum", "seq": 3}]}, ("in all_sum #3 at line 5",) * 2),
    ({"activity": [{"state": "waiting", "op": "barrier"}]}, ("in barrier #?", "in barrier #?")),
])
def test_place_of(sample, place):
    assert place_of(sample) == place


def test_text_table_lines_up_columns_and_ends_with_the_diagnosis():
    rows = [RankRow(0, "running line 3", "at line 3", "50%", "1.0 KB"), RankRow(1, "done", "done")]
    assert text_table(rows, "t") == ("t\nrank  state           cpu  memory\n0     running line 3  50%  1.0 KB\n"
                                     "1     done            ?    ?")
    waiting = [RankRow(0, "in all_sum at line 4 waiting on rank 1", "in all_sum at line 4", waiting=True),
               RankRow(1, "running line 3: time.sleep(3)", "at line 3")]
    assert text_table(waiting).splitlines()[-1] == "rank 0 is in all_sum at line 4 waiting on rank 1; rank 1 is at line 3: time.sleep(3)"
    assert str(Where(waiting, "w")).startswith("w\nrank") and Where(waiting).diagnosis == diagnosis(waiting)


def test_diagnosis_groups_ranks_in_one_place_waiting_first():
    rows = [RankRow(2, "running line 9", "at line 9"),
            RankRow(0, "in all_sum waiting on rank 2", "in all_sum", waiting=True),
            RankRow(1, "in all_sum waiting on rank 2", "in all_sum", waiting=True)]
    assert diagnosis(rows) == "ranks 0 and 1 are in all_sum; rank 2 is at line 9"
    assert diagnosis(rows[:1]) == "" and diagnosis(rows[1:]) == ""   # nobody waiting; all in one place
    says = "rank 0 waits in all_sum on rank 1"
    mlx = [RankRow(0, "x", "p0", waiting=True, says=says), RankRow(1, "y", "p0", says=says)]
    assert diagnosis(mlx) == says
    unknown = [RankRow(0, "in all_sum", "", waiting=True), RankRow(1, "running", "")]
    assert diagnosis(unknown) == "rank 0 is in all_sum; rank 1 is running"


def test_html_table_escapes_and_shows_the_diagnosis():
    rows = [RankRow(0, "at <b>", "a", waiting=True), RankRow(1, "x & y", "b")]
    out = html_table(rows, "t<1>")
    assert out.startswith("<div class='mlxj-where-title'>t&lt;1&gt;</div><table class='mlxj-where'><tr>"
                          "<th style='text-align:left'>rank</th>")
    assert "<td style='text-align:left'>at &lt;b&gt;</td>" in out and "x &amp; y" in out
    assert out.endswith("<div class='mlxj-where-diagnosis'><b>rank 0 is at &lt;b&gt;; rank 1 is x &amp; y</b></div>")
    assert html_table(rows[1:]).endswith("</table>") and Where(rows)._repr_html_() == html_table(rows)


def test_html_table_whole():
    rows = [RankRow(0, "a", "p", "1%", "2 B", waiting=True), RankRow(1, "b", "q")]
    td = "<td style='text-align:left'>"
    assert html_table(rows) == (
        "<table class='mlxj-where'><tr>" + "".join(f"<th style='text-align:left'>{c}</th>" for c in
                                                   ("rank", "state", "cpu", "memory")) + "</tr>"
        f"<tr>{td}0</td>{td}a</td>{td}1%</td>{td}2 B</td></tr><tr>{td}1</td>{td}b</td>{td}?</td>{td}?</td></tr>"
        "</table><div class='mlxj-where-diagnosis'><b>rank 0 is a; rank 1 is b</b></div>")
    assert Where(rows, "t")._repr_html_() == html_table(rows, "t") and html_table(rows, "t").startswith(
        "<div class='mlxj-where-title'>t</div><table")
    assert text_table(rows, "").startswith("rank  state")


def test_rows_of_plain_samples():
    samples = {0: {"line": 3, "source": "  " + "x" * 41 + " ", "cpu": 12.6, "rss": 2048},
               1: {"line": 4, "source": "y" * 40, "call": "f"},
               2: {"line": 5, "call": "f"}, 3: {"line": 6}, 4: {"running": False, "cpu": 1},
               5: {"cpu": 3, "rss": 0}, 6: {"line": 7, "call": "f"}}
    got = rows(samples, {5: "dead", 6: "done", 7: "raised"}, range(9))
    assert [(r.rank, r.state, r.place, r.cpu, r.memory, r.waiting) for r in got] == [
        (0, "running line 3: " + "x" * 40 + "...", "at line 3", "13%", "2.0 KB", False),
        (1, "running line 4: " + "y" * 40, "at line 4", "?", "?", False),
        (2, "running line 5 in f", "at line 5", "?", "?", False),
        (3, "running line 6", "at line 6", "?", "?", False),
        (4, "idle", "idle", "1%", "?", False),
        (5, "dead", "dead", "-", "?", False),
        (6, "done", "done", "?", "?", False),
        (7, "raised", "raised", "?", "?", False),
        (8, "running (no sample yet)", "", "?", "?", False)]


def test_a_collective_waits_on_the_ranks_elsewhere_or_ended():
    samples = {0: {"line": 4, "call": "dist.all_sum"}, 1: {"line": 4, "call": "dist.all_sum"}, 2: {"line": 9}}
    got = rows(samples, {3: "done"}, range(4))
    assert got[0].state == "in all_sum at line 4 waiting on ranks 2 and 3" and got[0].waiting
    assert rows({0: samples[0], 1: samples[1]}, {}, range(2))[0].state == "in all_sum at line 4"
    core = {0: {"line": 4, "activity": [{"state": "waiting", "op": "all_sum", "seq": 2, "waiting_on": 1,
                                         "elapsed": 1.25}]}, 1: {"line": 2}}
    assert rows(core, {}, range(2))[0].state == "in all_sum #2 at line 4 waiting on rank 1 for 1.2 s"
    assert rows(core, {}, [0])[0].state == "in all_sum #2 at line 4 waiting on rank 1 for 1.2 s"


def test_rows_keep_cpu_and_memory_for_every_kind_of_row():
    samples = {0: {"running": False, "cpu": 1, "rss": 1024}, 1: {"cpu": 2, "rss": 2048},
               2: {"line": 4, "debugger": {"line": 4}, "cpu": 3, "rss": 3072}}
    got = rows(samples, {1: "done"}, range(3))
    assert [(r.state, r.place, r.cpu, r.memory) for r in got] == [
        ("idle", "idle", "1%", "1.0 KB"), ("done", "done", "2%", "2.0 KB"),
        ("in pdb (line 4)", "in pdb (line 4)", "3%", "3.0 KB")]
    assert rows({0: {"running": True, "line": 2}}, {}, [0])[0].state == "running line 2"


def test_a_rank_in_pdb_is_what_the_others_wait_on():
    samples = {0: {"line": 4, "call": "dist.all_sum"}, 1: {"line": 4, "debugger": {"line": 4}}}
    got = rows(samples, {}, range(2))
    mlx = "; no timeout (MLX's collectives have none; the stop button ends the wait)"   # the wait has no end of its own
    assert got[0].state == "in all_sum at line 4 waiting on rank 1 (in pdb)" + mlx
    three = rows({**samples, 2: {"line": 7}}, {}, range(3))
    assert three[0].state == "in all_sum at line 4 waiting on ranks 1 and 2 (rank 1 in pdb)" + mlx


def test_waits_on_peer_bundle_and_where():
    assert waits_on_peer(RankRow(0, "in all_sum waiting on rank 1", "x"))
    assert waits_on_peer(RankRow(0, "x", "p", waiting=True, says="rank 0 waits on rank 1"))
    assert not waits_on_peer(RankRow(0, "x", "p", says="s")) and not waits_on_peer(RankRow(0, "waiting", "p", waiting=True))
    table = [RankRow(0, "a", "p", waiting=True), RankRow(1, "b", "q")]
    assert bundle(table, "t") == {"text/plain": text_table(table, "t"), "text/html": html_table(table, "t")}
    w = Where(table, "t")
    assert w.state(1) == "b" and w.state(0) == "a" and repr(w) == str(w) == text_table(table, "t")
    assert w.rows == table and w.title == "t"
