"""Where every rank is, as words: the states, the table and the diagnosis (pure, no processes)."""

from __future__ import annotations

import sys

from hypothesis import HealthCheck, given, settings, strategies as st

from mlx_jupyter.where import model, sample


def s(line=None, source="", call=None, activity=(), running=True, cpu=50.0, rss=1 << 20):
    return {"line": line, "source": source, "call": call, "activity": list(activity), "running": running,
            "cpu": cpu, "rss": rss}


def test_a_rank_in_a_collective_waits_on_the_rank_that_is_elsewhere():
    rows = model.rows({0: s(4, "dist.all_sum(x)", "dist.all_sum"), 1: s(3, "time.sleep(5)")}, {}, [0, 1])
    assert rows[0].state == "in all_sum at line 4 waiting on rank 1"
    assert rows[1].state == "running line 3: time.sleep(5)"
    assert model.diagnosis(rows) == "rank 0 is in all_sum at line 4 waiting on rank 1; rank 1 is at line 3: time.sleep(5)"


def test_the_core_record_names_the_op_its_number_the_peer_and_the_time():
    op = {"state": "waiting", "op": "all_sum", "seq": 12, "waiting_on": 2, "elapsed": 3.04}
    recv = {"state": "waiting", "op": "recv", "seq": 3, "waiting_on": 2, "elapsed": 1.0}
    samples = {0: s(5, activity=[op]), 2: s(5, activity=[op]), 1: s(9, activity=[recv])}
    rows = model.rows(samples, {}, [0, 1, 2])
    assert rows[0].state == "in all_sum #12 at line 5 waiting on rank 2 for 3.0 s"
    assert model.diagnosis(rows) == ("ranks 0 and 2 are in all_sum #12 at line 5; "
                                     "rank 1 is in recv #3 at line 9 waiting on rank 2 for 1.0 s")


def test_mlx_world_a_blocked_eval_shows_the_cell_line():
    rows = model.rows({0: s(2, "mx.eval(mx.distributed.all_sum(x))", "mx.distributed.all_sum"), 1: s(1, "x")},
                      {}, [0, 1])
    assert rows[0].state == "in mx.distributed.all_sum at line 2 waiting on rank 1"


def test_ended_idle_and_unsampled_ranks():
    rows = model.rows({1: s(running=False), 2: s(3, "f()")}, {0: "done", 3: "dead"}, [0, 1, 2, 3, 4])
    assert [r.state for r in rows] == ["done", "idle", "running line 3: f()", "dead", "running (no sample yet)"]
    assert model.diagnosis(rows) == ""  # nobody waits in a collective: nothing to say


def test_ranks_together_need_no_diagnosis_and_the_table_has_every_rank():
    same = {r: s(4, "dist.all_sum(x)", "dist.all_sum") for r in range(3)}
    rows = model.rows(same, {}, [0, 1, 2])
    assert model.diagnosis(rows) == "" and all(r.state == "in all_sum at line 4" for r in rows)
    text = model.text_table(rows, "title")
    assert text.splitlines()[0] == "title" and len(text.splitlines()) == 5 and "1.0 MB" in text
    assert "<table" in model.html_table(rows)


def test_the_stack_sampler_finds_the_cell_line_and_the_named_call():
    import threading

    import numpy as np

    seen = {}
    ready, release = threading.Event(), threading.Event()

    def cell_code():  # stands for a cell's frame: its file is given as the cell's
        ready.set()
        np.asarray([release.wait(5)])

    t = threading.Thread(target=cell_code)
    t.start()
    ready.wait(5)
    seen = sample.take(t.ident, 0, sample.CpuMeter(), 1, cell_files=(__file__,))
    release.set()
    t.join()
    assert seen["file"] == __file__ and "release.wait" in seen["source"], seen
    assert seen["running"] and seen["rank"] == 0 and isinstance(seen["cpu"], float)


def test_a_call_written_on_the_cell_line_is_named_when_mlx_has_no_frame():
    assert sample._call_in_source("y = mx.eval(mx.distributed.all_sum(x))") == "mx.distributed.all_sum"
    assert sample._call_in_source("mx.eval(y)") == "mx.eval"
    assert sample._call_in_source("time.sleep(1)") is None


@settings(max_examples=60, suppress_health_check=[HealthCheck.too_slow], deadline=None)
@given(st.dictionaries(st.integers(0, 7), st.fixed_dictionaries({
    "line": st.none() | st.integers(1, 500), "source": st.text(max_size=80),
    "call": st.none() | st.sampled_from(["dist.all_sum", "mx.eval", "np.dot", "core.recv"]),
    "running": st.booleans(), "cpu": st.none() | st.floats(0, 800), "rss": st.none() | st.integers(0, 1 << 40),
    "activity": st.lists(st.fixed_dictionaries({
        "state": st.sampled_from(["idle", "running", "waiting"]), "op": st.none() | st.sampled_from(["all_sum", "recv"]),
        "seq": st.integers(0, 1 << 40), "waiting_on": st.none() | st.integers(0, 7),
        "elapsed": st.floats(0, 1e6)}, optional={"timeout": st.none() | st.floats(0, 1e9),
                                               "group": st.sampled_from(["core:1", "mlx-ring:1"])}), max_size=2)},
    optional={"debugger": st.fixed_dictionaries({"line": st.integers(1, 500)}, optional={
        "func": st.text(max_size=10), "post_mortem": st.booleans()})}), max_size=4),
    st.dictionaries(st.integers(0, 7), st.sampled_from(["done", "raised", "dead"])))
def test_any_samples_make_a_row_per_rank_and_a_one_line_diagnosis(samples, ended):
    rows = model.rows(samples, ended, list(range(8)))
    assert [r.rank for r in rows] == list(range(8))
    assert "\n" not in model.diagnosis(rows)
    assert model.text_table(rows)


def waiting(timeout=None, group="core:1", on=1):
    return {"state": "waiting", "op": "all_sum", "seq": 4, "waiting_on": on, "elapsed": 12.04, "timeout": timeout,
            "group": group}


def test_a_rank_in_pdb_and_the_one_waiting_on_it_with_its_timeout():
    samples = {0: s(5, activity=[waiting(60.0)]), 1: {**s(5), "debugger": {"line": 5, "func": "<module>"}}}
    rows = model.rows(samples, {}, [0, 1])
    assert rows[1].state == "in pdb (line 5)"
    assert rows[0].state == "in all_sum #4 at line 5 waiting on rank 1 (in pdb) for 12.0 s; times out after 60 s"
    assert model.diagnosis(rows).endswith("; rank 1 is in pdb (line 5)")


def test_the_timeout_words_say_when_nothing_ends_the_wait():
    pm = {**s(2), "debugger": {"line": 3, "func": "scale", "post_mortem": True}}
    rows = model.rows({0: s(5, activity=[waiting(None)]), 1: pm}, {}, [0, 1])
    assert rows[1].state == "in pdb post-mortem (line 3 in scale)"
    assert rows[0].state.endswith("; no timeout set (timeout= or MLX_JUPYTER_TIMEOUT; the stop button ends the wait)")
    mlx = model.rows({0: s(6, "mx.eval(mx.distributed.all_sum(x))", "mx.distributed.all_sum"), 1: pm}, {}, [0, 1])
    assert mlx[0].state == ("in mx.distributed.all_sum at line 6 waiting on rank 1 (in pdb); "
                            "no timeout (MLX's collectives have none; the stop button ends the wait)")


def test_a_rank_in_pdb_on_the_very_line_of_the_collective_is_still_waited_on():
    """pdb stops before the line runs: a rank stopped at the all_sum line is not in the all_sum."""
    line6 = "mx.eval(mx.distributed.all_sum(x))"
    samples = {0: s(6, line6, "mx.distributed.all_sum"), 1: {**s(6, line6), "debugger": {"line": 6}}}
    rows = model.rows(samples, {}, [0, 1])
    assert rows[0].state.startswith("in mx.distributed.all_sum at line 6 waiting on rank 1 (in pdb); no timeout")


def test_of_several_ranks_waited_on_the_ones_in_pdb_are_named():
    pdb_at = {**s(2), "debugger": {"line": 2}}
    samples = {0: s(4, "dist.all_sum(x)", "dist.all_sum"), 1: pdb_at, 2: s(9, "time.sleep(1)")}
    rows = model.rows(samples, {}, [0, 1, 2])
    assert rows[0].state.startswith("in all_sum at line 4 waiting on ranks 1 and 2 (rank 1 in pdb); no timeout")


def test_a_plain_pdb_at_its_prompt_is_seen_on_the_stack(tmp_path):
    """A launched script's own pdb (no debugger of ours to say so): its Pdb.interaction frame gives it away."""
    import pdb
    import threading

    answer = threading.Event()

    class Stdin:
        def readline(self) -> str:
            answer.wait(10)
            return "c\n"

    script = str(tmp_path / "script.py")
    code = compile("x = 1\ndebugger.set_trace()\ny = 2\n", script, "exec")
    debugger = pdb.Pdb(stdin=Stdin(), stdout=open("/dev/null", "w"))
    debugger.use_rawinput = False
    t = threading.Thread(target=exec, args=(code, {"debugger": debugger}))
    t.start()
    try:
        for _ in range(200):  # polling the other thread's stack until it is at the prompt (bounded)
            got = sample.take(t.ident, 0, cell_files=(script,))
            if got.get("debugger"):
                break
            answer.wait(0.01)
        assert got.get("debugger") == {"line": 3, "func": "<module>", "post_mortem": False}, got
        assert model.rows({0: got}, {}, [0])[0].state == "in pdb (line 3)"
    finally:
        answer.set()
        t.join(10)
