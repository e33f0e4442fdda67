"""The MLX record's words (pure): who waits in which call on whom, splits, send/recv, mismatches."""

from __future__ import annotations

from mlx_jupyter.where import mlx_model, model


def call(key, seq, op="all_sum", dtype="float32", shape=(6,), at="line 3", peer=None, via=None):
    return {"key": key, "seq": seq, "op": op, "dtype": dtype, "shape": list(shape), "peer": peer, "at": at,
            "via": via}


def sample(rank, counts, calls, groups=None, line=4, source="print(y)", evaluating=True, still=1.0, evaluates=None):
    return {"rank": rank, "running": True, "line": line, "source": source, "still": still,
            "mlx_eval": source if evaluating else None, **({"mlx_evaluates": evaluates} if evaluates else {}),
            "mlx": {"counts": counts, "groups": groups or {"world": [rank, 2]}, "calls": calls}}


def words(samples, ranks, ended=None):
    table = model.rows(samples, ended or {}, ranks)
    return {r.rank: r.state for r in table}, model.diagnosis(table)


def test_the_issues_example():
    s = {0: sample(0, {"world": 1}, [call("world", 1)]),
         1: sample(1, {"world": 0}, [], line=2, source="time.sleep(1000)", evaluating=False)}
    states, diag = words(s, [0, 1])
    assert diag == ("rank 0 waits in MLX all_sum #1 (float32[6], built at line 3, evaluated at line 4) on rank 1 "
                    "for 1.0 s; rank 1 has called 0 MLX collectives and is at line 2: time.sleep(1000)")


def test_no_wait_named_before_the_rank_stood_still_for_two_samples():
    s = {0: sample(0, {"world": 1}, [call("world", 1)], still=0.0),
         1: sample(1, {"world": 0}, [], line=2, source="time.sleep(1000)", evaluating=False)}
    states, _ = words(s, [0, 1])
    assert "waits in MLX" not in states[0]


def test_a_rank_not_evaluating_is_not_waiting():
    s = {0: sample(0, {"world": 1}, [call("world", 1)], source="time.sleep(3)", evaluating=False),
         1: sample(1, {"world": 0}, [], evaluating=False)}
    states, diag = words(s, [0, 1])
    assert "MLX" not in states[0] and "MLX" not in diag


def test_the_first_call_a_peer_has_not_made_is_the_one_waited_in():
    calls = [call("world", 1, at="line 1"), call("world", 2, op="sum_scatter", shape=(4,), at="line 2"),
             call("world", 3, at="line 3")]
    s = {0: sample(0, {"world": 3}, calls), 1: sample(1, {"world": 1}, calls[:1], evaluating=False),
         2: sample(2, {"world": 3}, calls), 3: sample(3, {"world": 1}, calls[:1], evaluating=False)}
    states, diag = words(s, [0, 1, 2, 3])
    assert states[0].startswith("waits in MLX sum_scatter #2 (float32[4], built at line 2, evaluated at line 4) "
                                "on ranks 1 and 3")
    assert states[1] == "has called 1 MLX collective and is at line 4: print(y)"


def test_a_split_compares_only_the_ranks_in_it():
    g = {"world": [0, 4], "world/0": [0, 2]}
    s = {0: sample(0, {"world": 0, "world/0": 1}, [call("world/0", 1)], groups=g),
         1: sample(1, {"world": 0, "world/1": 0}, [], groups={"world": [1, 4], "world/1": [0, 2]}, evaluating=False),
         2: sample(2, {"world": 0, "world/0": 0}, [], groups={"world": [2, 4], "world/0": [1, 2]}, evaluating=False),
         3: sample(3, {"world": 0, "world/1": 0}, [], groups={"world": [3, 4], "world/1": [1, 2]}, evaluating=False)}
    states, _ = words(s, [0, 1, 2, 3])
    assert states[0].startswith("waits in MLX all_sum #1 (float32[6], built at line 3, evaluated at line 4) on rank 2")
    assert states[2] == "has called 0 MLX collectives on group world/0 and is at line 4: print(y)"


def test_recv_waits_on_the_sender():
    s = {0: sample(0, {"world": 0, "world:1>0": 1}, [call("world:1>0", 1, op="recv", shape=(3,), peer=1)]),
         1: sample(1, {"world": 0}, [], line=2, source="time.sleep(9)", evaluating=False)}
    states, diag = words(s, [0, 1])
    assert states[0].startswith("waits in MLX recv #1 from rank 1 (float32[3], built at line 3, evaluated at line 4) "
                                "on rank 1")
    assert states[1] == "has made 0 MLX sends to rank 0 and is at line 2: time.sleep(9)"


def test_a_peer_that_made_the_call_but_does_not_evaluate_it():
    s = {0: sample(0, {"world": 1}, [call("world", 1)]),
         1: sample(1, {"world": 1}, [call("world", 1, at="line 2")], line=3, source="time.sleep(5)",
                   evaluating=False)}
    states, _ = words(s, [0, 1])
    assert states[0].startswith("waits in MLX all_sum #1 (float32[6], built at line 3, evaluated at line 4) on rank 1")
    assert states[1] == "has called MLX all_sum #1 (built at line 2) but is at line 3: time.sleep(5), not evaluating it"


def test_a_mismatch_names_both_calls_also_against_a_rank_that_finished():
    s = {0: {"rank": 0, "final": True, "mlx": {"counts": {"world": 3}, "groups": {"world": [0, 2]},
                                               "calls": [call("world", 3, shape=(4,), at="line 5")]}},
         1: sample(1, {"world": 3}, [call("world", 3, op="all_gather", shape=(8,), at="line 6")], line=7)}
    states, diag = words(s, [0, 1], {0: "done"})
    assert states[1] == ("in MLX all_gather #3 (float32[8], built at line 6, evaluated at line 7), which does not "
                         "match rank 0's all_sum #3 (float32[4], built at line 5)")
    assert diag == ("MLX collectives do not match: rank 0's all_sum #3 of float32[4] (built at line 5) and "
                    "rank 1's all_gather #3 of float32[8] (built at line 6); rank 0 is done")


def test_a_dtype_mismatch_of_send_and_recv():
    s = {0: sample(0, {"world:0>1": 1}, [call("world:0>1", 1, op="send", dtype="float16", shape=(3,), peer=1)]),
         1: sample(1, {"world:0>1": 1}, [call("world:0>1", 1, op="recv", shape=(3,), peer=0)])}
    _, diag = words(s, [0, 1])
    assert diag.startswith("MLX collectives do not match: rank 0's send #1 to rank 1 of float16[3]")


def test_ranks_together_say_nothing_more():
    c = [call("world", 1)]
    s = {0: sample(0, {"world": 1}, c), 1: sample(1, {"world": 1}, c)}
    assert words(s, [0, 1])[1] == ""
    assert mlx_model.states(s, [0, 1], {}) == {}


def test_a_rank_let_through_a_mismatch_is_named_in_the_call_it_now_waits_in():
    """MLX's ring let rank 0 through its all_sum #1, which rank 1's all_gather #1 does not match: rank 0 now
    evaluates its #2 (built at line 4, evaluated at line 5), and its line says so, not #1."""
    c0 = [call("world", 1, shape=(4,), at="line 2"), call("world", 2, shape=(2,), at="line 4")]
    c1 = [call("world", 1, op="all_gather", shape=(8,), at="line 2")]
    s = {0: sample(0, {"world": 2}, c0, line=5, source="mx.eval(z)", evaluates=["world", 2]),
         1: sample(1, {"world": 1}, c1, line=3, source="mx.eval(y)", evaluates=["world", 1])}
    states, diag = words(s, [0, 1])
    assert states[0] == "waits in MLX all_sum #2 (float32[2], built at line 4, evaluated at line 5) on rank 1 for 1.0 s"
    assert states[1] == ("in MLX all_gather #1 (float32[8], built at line 2, evaluated at line 3), which does not "
                         "match rank 0's all_sum #1 (float32[4], built at line 2)")
    assert diag == ("rank 0 waits in MLX all_sum #2 (float32[2], built at line 4, evaluated at line 5) on rank 1 for "
                    "1.0 s; MLX collectives do not match: rank 0's all_sum #1 of float32[4] (built at line 2) and "
                    "rank 1's all_gather #1 of float32[8] (built at line 2)"), diag


def test_a_mismatch_names_the_call_evaluated_not_the_newest():
    """Both calls differ; rank 0 evaluates its #1 (print(a)), though #2 was built after it."""
    c0 = [call("world", 1, shape=(4,), at="line 2"), call("world", 2, shape=(2,), at="line 3")]
    c1 = [call("world", 1, shape=(8,), at="line 2"), call("world", 2, shape=(6,), at="line 3")]
    s = {0: sample(0, {"world": 2}, c0, source="print(a)", evaluates=["world", 1]),
         1: sample(1, {"world": 2}, c1, source="print(a)", evaluates=["world", 1])}
    states, _ = words(s, [0, 1])
    assert states[0] == ("in MLX all_sum #1 (float32[4], built at line 2, evaluated at line 4), which does not "
                         "match rank 1's all_sum #1 (float32[8], built at line 2)")


def test_the_op_built_last_evaluated_first_is_the_one_waited_in():
    """Lazy: both ranks built #1 and #2 alike; rank 0 evaluates #2 (print(b)), rank 1 #1 (print(a))."""
    c = [call("world", 1, shape=(4,), at="line 2"), call("world", 2, shape=(8,), at="line 3")]
    s = {0: sample(0, {"world": 2}, c, source="print(b)", evaluates=["world", 2]),
         1: sample(1, {"world": 2}, c, source="print(a)", evaluates=["world", 1])}
    states, _ = words(s, [0, 1])
    assert states[0] == "waits in MLX all_sum #2 (float32[8], built at line 3, evaluated at line 4) on rank 1 for 1.0 s"
    assert states[1] == "waits in MLX all_sum #1 (float32[4], built at line 2, evaluated at line 4) on rank 0 for 1.0 s"


def test_a_rank_that_went_on_past_a_mismatch_is_not_said_to_be_in_it():
    s = {0: sample(0, {"world": 1}, [call("world", 1, shape=(4,), at="line 2")], line=6, source="time.sleep(9)",
                   evaluating=False),
         1: sample(1, {"world": 1}, [call("world", 1, op="all_gather", shape=(8,), at="line 2")], line=3,
                   source="mx.eval(y)")}
    states, _ = words(s, [0, 1])
    assert states[0] == ("has called MLX all_sum #1 (float32[4], built at line 2), which does not match rank 1's "
                         "all_gather #1 (float32[8], built at line 2), and is at line 6: time.sleep(9)")
