"""Slurm's output read at the edges: each duration form, each refusal's words, job and node states."""

from __future__ import annotations

import pytest

from mlx_jupyter.launch.slurm.parse import (JobState, NodeInfo, SlurmOutputError, check_node_name, format_duration,
                                           parse_duration, parse_hostnames, parse_job_id, parse_sinfo_line,
                                           parse_squeue_line, parse_task_list, split_label)


@pytest.mark.parametrize("text, seconds", [
    ("1-02:03:04", 93784), ("1-02:03", 93780), ("1-02", 93600), ("02:03:04", 7384), ("03:04", 184), (" 5 ", 300),
    ("0:00", 0), ("UNLIMITED", None), ("INVALID", None), ("NOT_SET", None), ("N/A", None), ("Partition_Limit", None),
    ("", None),
])
def test_each_duration_form(text, seconds):
    assert parse_duration(text) == seconds


@pytest.mark.parametrize("text", ["1:2:3:4", "-5", "1-", "x", "5 min", "unlimited"])
def test_a_bad_duration_is_quoted(text):
    with pytest.raises(SlurmOutputError, match=f"^{text!r} is not a Slurm duration$".replace("(", r"\(")):
        parse_duration(text)


@pytest.mark.parametrize("seconds, text", [(None, "unlimited"), (-5, "0 s"), (0, "0 s"), (59, "59 s"), (60, "1 min"),
                                           (61, "1 min 01 s"), (3599, "59 min 59 s"), (3600, "1 h 00 min"),
                                           (3661, "1 h 01 min"), (86399, "23 h 59 min"), (86400, "1 d 0 h"),
                                           (90000, "1 d 1 h"), (12.7, "12 s")])
def test_format_duration(seconds, text):
    assert format_duration(seconds) == text


def test_job_ids_task_lists_and_node_names():
    assert parse_job_id("123;cluster\n") == 123 and parse_job_id(" 7 \n") == 7
    for bad in ("0", "12a", ";x", "-3"):
        with pytest.raises(SlurmOutputError, match=f"^sbatch --parsable printed {bad!r}, not a job id$"):
            parse_job_id(bad)
    assert parse_task_list("3") == [3] and parse_task_list(" 0-1 ,4") == [0, 1, 4]
    assert len(parse_task_list("0-1000000")) == 1_000_001
    for bad in ("2-1", "0-1000001", "1,,2", "a", ""):
        with pytest.raises(SlurmOutputError, match=f"^{bad!r} is not a task list$"):
            parse_task_list(bad)
    assert check_node_name("node-1.x_y") == "node-1.x_y"
    for bad in ("-n", ".n", "a b", ""):
        with pytest.raises(SlurmOutputError, match=f"^{bad!r} is not a Slurm node name$"):
            check_node_name(bad)
    assert parse_hostnames("node1\n\n node2 \n") == ["node1", "node2"]
    with pytest.raises(SlurmOutputError, match="^scontrol show hostnames printed no node name$"):
        parse_hostnames(" \n")
    long = "x" * 121
    with pytest.raises(SlurmOutputError, match=r"^'x{120}\.\.\.' is not a task list$"):
        parse_task_list(long)


def test_squeue_line_whole_and_each_refusal():
    line = "42|RUNNING|1:05|UNLIMITED|2:00|2|node[1-2]|None\n"
    assert parse_squeue_line(line) == JobState(42, "RUNNING", "None", "node[1-2]", 2, 65, None, 120)
    assert parse_squeue_line("7| PENDING |0:00|1:00|1:00| 1 ||Resources | x") == \
        JobState(7, "PENDING", "Resources | x", "", 1, 0, 60, 60)
    bad = {"1|R|0:00|0:00|0:00|1|n": "expected 8 fields separated by '|'",
           "x|RUNNING|0:00|0:00|0:00|1|n|r": "'x' is not a job id",
           "1|running|0:00|0:00|0:00|1|n|r": "'running' is not a job state",
           "1|RUNNING|0:00|0:00|0:00|-1|n|r": "'-1' is not a node count",
           "1|RUNNING|0:00|0:00|0:00|1|n 1|r": "'n 1' is not a node list",
           "1|RUNNING|soon|0:00|0:00|1|n|r": "'soon' is not a Slurm duration"}
    for text, why in bad.items():
        with pytest.raises(SlurmOutputError) as info:
            parse_squeue_line(text)
        assert str(info.value) == f"squeue printed {text!r}: {why}"


@pytest.mark.parametrize("state, pending, running, finished, words", [
    ("PENDING", True, False, False, "PENDING (Resources)"), ("REQUEUED", True, False, False, "REQUEUED (Resources)"),
    ("RUNNING", False, True, False, "RUNNING on node[1-2]"), ("COMPLETING", False, False, True, "COMPLETING on node[1-2]"),
    ("TIMEOUT", False, False, True, "TIMEOUT on node[1-2]"), ("NODE_FAIL", False, False, True, "NODE_FAIL on node[1-2]"),
])
def test_job_states(state, pending, running, finished, words):
    job = JobState(1, state, "Resources", "node[1-2]", 2, 0, None, None)
    assert (job.pending, job.running, job.finished, job.describe()) == (pending, running, finished, words)
    assert JobState(1, "PENDING", "None", "", 1, 0, None, None).describe() == "PENDING"
    assert JobState(1, "PENDING", "", "", 1, 0, None, None).describe() == "PENDING"
    assert JobState(1, "RUNNING", "", "", 1, 0, None, None).describe() == "RUNNING"


def test_sinfo_line_whole_and_each_refusal():
    assert parse_sinfo_line(" node1|10.0.0.1|idle \n") == NodeInfo("node1", "10.0.0.1", "idle")
    assert parse_sinfo_line("node1|[fe80::1%eth0]|down*").responding is False
    assert parse_sinfo_line("node1|h|allocated").responding is True
    bad = {"node1|x": "expected 3 fields separated by '|'", "node1|a b|idle": "'a b' is not a node address",
           "node1|x|idle?": "'idle?' is not a node state", "node1|x|1dle": "'1dle' is not a node state"}
    for text, why in bad.items():
        with pytest.raises(SlurmOutputError) as info:
            parse_sinfo_line(text)
        assert str(info.value) == f"sinfo printed {text!r}: {why}"
    with pytest.raises(SlurmOutputError, match=r"^'n 1' is not a Slurm node name$"):
        parse_sinfo_line("n 1|x|idle")


def test_labels():
    assert split_label(" 3: text") == (3, "text") and split_label("12: ") == (12, "")
    assert split_label("3:text") is None and split_label("x: 3") is None


def test_more_edges():
    assert parse_job_id("1") == 1 and parse_job_id("5;c;d") == 5
    assert parse_task_list("999999-1000000") == [999999, 1000000]
    assert parse_squeue_line("3|RUNNING|0:01|0:01|0:01|1|NODE[1-2]|r").nodes == "NODE[1-2]"
    assert parse_sinfo_line("n1|Node1.LAN|idle").addr == "Node1.LAN"
    exactly = "x" * 120   # quoted whole; one more and it is cut
    with pytest.raises(SlurmOutputError, match=rf"^'{exactly}' is not a task list$"):
        parse_task_list(exactly)
