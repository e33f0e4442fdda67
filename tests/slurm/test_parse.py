"""Reading Slurm's output (untrusted text): recorded cases from Slurm 22.05 and property tests."""

from __future__ import annotations

import re

import pytest
from hypothesis import given
from hypothesis import strategies as st

from mlx_jupyter.launch.slurm.output import StepOutput
from mlx_jupyter.launch.slurm.parse import (JobState, SlurmOutputError, format_duration, parse_duration,
                                           parse_hostnames, parse_job_id, parse_sinfo_line, parse_squeue_line,
                                           parse_srun_line, parse_task_list, split_label)
from mlx_jupyter.launch.slurm.wrapper import MARKER

# ------------------------------------------------------------------ recorded --
# What Slurm 22.05.8 printed in the test bed (srun --label, squeue/sinfo with our formats).
SRUN_LINES = {
    "srun: error: node2: task 3: Exited with exit code 3": ("task", "node2", (3,), "exited with code 3", 3),
    "srun: error: node1: tasks 0-1: Terminated": ("task", "node1", (0, 1), "Terminated", None),
    "srun: error: node3: tasks 4-5,7: Killed": ("task", "node3", (4, 5, 7), "Killed", None),
    "srun: error: node4: task 11: Segmentation fault": ("task", "node4", (11,), "Segmentation fault", None),
    "srun: error: Node failure on node3": ("node_failure", "node3", (), "node failure", None),
    "slurmstepd-node1: error: *** STEP 8.0 ON node1 CANCELLED AT 2026-12-05T12:57:23 DUE TO TIME LIMIT ***":
        ("cancelled", "node1", (), "TIME LIMIT", None),
    "slurmstepd-node1: error: *** STEP 7.0 ON node1 CANCELLED AT 2026-12-05T12:43:04 DUE TO NODE FAILURE, "
    "SEE SLURMCTLD LOG FOR DETAILS ***": ("cancelled", "node1", (), "NODE FAILURE", None),
    "slurmstepd-node1: error: *** STEP 7.0 ON node1 CANCELLED AT 2026-12-05T12:57:07 ***":
        ("cancelled", "node1", (), "", None),
    "slurmstepd: error: *** JOB 12 ON node2 CANCELLED AT 2026-12-05T13:00:00 DUE TO PREEMPTION ***":
        ("cancelled", "node2", (), "PREEMPTION", None),
}


@pytest.mark.parametrize("line", SRUN_LINES)
def test_recorded_srun_lines(line):
    note = parse_srun_line(line)
    assert (note.kind, note.node, note.tasks, note.what, note.code) == SRUN_LINES[line]


@pytest.mark.parametrize("line", ["srun: launch/slurm: _step_signal: Terminating StepId=2.0",
                                  "srun: Job step aborted: Waiting up to 4 seconds for job step to finish.",
                                  "srun: Force Terminated StepId=1.0", "hello", ""])
def test_other_srun_lines_are_no_note(line):
    assert parse_srun_line(line) is None


def test_recorded_squeue_lines():
    pending = parse_squeue_line("8|PENDING|0:00|UNLIMITED|UNLIMITED|4||Nodes required for job are DOWN, DRAINED "
                                "or reserved for jobs in higher priority partitions")
    assert (pending.state, pending.nodes, pending.node_count, pending.time_left) == ("PENDING", "", 4, None)
    assert pending.pending and pending.describe().startswith("PENDING (Nodes required for job are DOWN")
    running = parse_squeue_line("6|RUNNING|0:01|0:59|1:00|1|node1|None")
    assert (running.elapsed, running.time_left, running.time_limit) == (1, 59, 60)
    assert running.describe() == "RUNNING on node1"
    timeout = parse_squeue_line("6|TIMEOUT|1-02:03:04|0:00|1-00:00:00|4|node[1-4]|TimeLimit")
    assert timeout.finished and timeout.elapsed == 93784 and timeout.time_limit == 86400
    assert parse_squeue_line("16|PENDING|0:00|1:00:00|1:00:00|2||Resources").describe() == "PENDING (Resources)"


@pytest.mark.parametrize("line", ["8|PENDING|0:00", "x|RUNNING|0:01|0:59|1:00|1|node1|None",
                                  "8|running|0:01|0:59|1:00|1|node1|None", "8|RUNNING|soon|0:59|1:00|1|node1|None",
                                  "8|RUNNING|0:01|0:59|1:00|one|node1|None", "8|RUNNING|0:01|0:59|1:00|1|node 1;rm|x"])
def test_bad_squeue_lines_are_errors_quoting_them(line):
    with pytest.raises(SlurmOutputError, match="squeue printed"):
        parse_squeue_line(line)


def test_recorded_sinfo_lines():
    node = parse_sinfo_line("node3|10.201.158.13|down*")
    assert (node.name, node.addr, node.state, node.responding) == ("node3", "10.201.158.13", "down*", False)
    assert parse_sinfo_line("gpu-a01|gpu-a01.cluster|mixed").responding
    for bad in ("node3|10.0.0.1", "node;3|10.0.0.1|idle", "node3|10.0.0.1 x|idle", "node3|10.0.0.1|IDLE now"):
        with pytest.raises(SlurmOutputError):
            parse_sinfo_line(bad)


def test_job_ids_and_hostnames():
    assert parse_job_id("123\n") == 123 and parse_job_id("77;cluster2\n") == 77
    for bad in ("", "abc", "0", "-3", "Submitted batch job 12"):
        with pytest.raises(SlurmOutputError, match="not a job id"):
            parse_job_id(bad)
    assert parse_hostnames("node1\nnode2\n\n") == ["node1", "node2"]
    with pytest.raises(SlurmOutputError):
        parse_hostnames("node1\nnode$(x)\n")
    with pytest.raises(SlurmOutputError):
        parse_hostnames("\n")


def test_durations():
    assert [parse_duration(t) for t in ("UNLIMITED", "INVALID", "NOT_SET", "0:00", "4:10", "1:00:00", "2-00:00:00",
                                        "2-03", "2-03:04", "30")] == \
        [None, None, None, 0, 250, 3600, 172800, 183600, 183840, 1800]
    assert [format_duration(s) for s in (None, 5, 60, 250, 3900, 90000)] == \
        ["unlimited", "5 s", "1 min", "4 min 10 s", "1 h 05 min", "1 d 1 h"]
    for bad in ("1:2:3:4", "x", "-1", "1--2"):
        with pytest.raises(SlurmOutputError):
            parse_duration(bad)


# ------------------------------------------------------------------ properties --
def slurm_time(seconds: int) -> str:
    """A duration as squeue prints it."""
    d, rest = divmod(seconds, 86400)
    h, rest = divmod(rest, 3600)
    m, s = divmod(rest, 60)
    if d:
        return f"{d}-{h:02d}:{m:02d}:{s:02d}"
    return f"{h}:{m:02d}:{s:02d}" if h else f"{m}:{s:02d}"


@given(st.integers(0, 400 * 86400))
def test_durations_round_trip(seconds):
    assert parse_duration(slurm_time(seconds)) == seconds


ANY_TEXT = st.text(st.characters(blacklist_categories=("Cs",)), max_size=80)


def _quoted(text: str) -> str:
    """How the parsers quote what they refuse (at most 120 characters)."""
    return repr(text if len(text) <= 120 else text[:120] + "...")


def _read(parse, text):
    """(what ``parse`` read, None) or (None, its SlurmOutputError's message); any other error fails."""
    try:
        return parse(text), None
    except SlurmOutputError as exc:
        return None, str(exc)


@given(st.one_of(ANY_TEXT, st.from_regex(r"\s*[0-9]{1,4}(-[0-9]{1,2})?(:[0-9]{1,2}){0,2}\s*", fullmatch=True),
                 st.from_regex(r"[0-9]{1,3}(-[0-9]{1,3})?(,[0-9]{1,3}(-[0-9]{1,3})?)*", fullmatch=True)))
def test_what_each_parser_accepts_reads_back_and_what_it_refuses_it_quotes(text):
    seconds, err = _read(parse_duration, text)
    if err:
        assert err == f"{_quoted(text.strip())} is not a Slurm duration"
    elif seconds is None:
        assert text.strip() in ("UNLIMITED", "INVALID", "NOT_SET", "N/A", "Partition_Limit", "")
    else:
        assert seconds >= 0 and parse_duration(slurm_time(seconds)) == seconds

    tasks, err = _read(parse_task_list, text)
    if err:
        assert err == f"{_quoted(text)} is not a task list"
    else:   # each comma-separated part is N or LO-HI (LO <= HI): the ids, in the order written
        assert tasks and parse_task_list(",".join(map(str, tasks))) == tasks
        assert len(tasks) >= text.count(",") + 1

    job, err = _read(parse_job_id, text)
    first = text.strip().split(";", 1)[0].strip()
    if err:
        assert err == f"sbatch --parsable printed {_quoted(text.strip())}, not a job id"
    else:
        assert first.isascii() and first.isdigit() and int(first) == job > 0

    names, err = _read(parse_hostnames, text)
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    if err:
        assert err == "scontrol show hostnames printed no node name" if not lines else \
            any(err == f"{_quoted(n)} is not a Slurm node name" for n in lines), err
    else:
        assert names == lines and all(re.fullmatch(r"[A-Za-z0-9_][A-Za-z0-9._-]*", n) for n in names)

    state, err = _read(parse_squeue_line, text)
    if err:
        assert err.startswith(f"squeue printed {_quoted(text)}: "), err
    else:
        assert state.job_id == int(text.split("|")[0]) > 0 and state.state == text.split("|")[1].strip()
    node, err = _read(parse_sinfo_line, text)
    if err:
        assert err.startswith(f"sinfo printed {_quoted(text)}: ") or err.endswith(" is not a Slurm node name"), err
    else:
        assert "|".join((node.name, node.addr, node.state)) == "|".join(p.strip() for p in text.strip().split("|"))

    note = parse_srun_line(text)   # None, or a note about a node named as Slurm names them
    assert note is None or (note.kind in ("task", "node_failure", "cancelled") and note.node and note.node in text)
    label = split_label(text)
    assert label is None or (int(text.split(":", 1)[0]) == label[0] and text == text.split(":", 1)[0] + ": " + label[1])


node_names = st.from_regex(r"[a-z][a-z0-9-]{0,10}[0-9]", fullmatch=True)
states = st.sampled_from(["PENDING", "RUNNING", "COMPLETING", "TIMEOUT", "NODE_FAIL", "CANCELLED"])
reasons = st.text(st.characters(blacklist_categories=("Cs", "Cc")), max_size=40).map(str.strip)


@given(st.integers(1, 10**9), states, st.integers(0, 10**7), st.one_of(st.none(), st.integers(0, 10**7)),
       st.integers(1, 5000), st.lists(node_names, max_size=3), reasons)
def test_squeue_lines_round_trip(job, state, elapsed, limit, count, nodes, reason):
    nodelist = ",".join(nodes)
    line = "|".join([str(job), state, slurm_time(elapsed), "UNLIMITED" if limit is None else slurm_time(limit),
                     "UNLIMITED" if limit is None else slurm_time(limit), str(count), nodelist, reason])
    assert parse_squeue_line(line) == JobState(job, state, reason, nodelist, count, elapsed, limit, limit)


@given(st.lists(st.integers(0, 300), min_size=1, unique=True))
def test_task_lists_round_trip(tasks):
    tasks = sorted(tasks)
    ranges, start = [], tasks[0]
    for prev, cur in zip(tasks, tasks[1:] + [None]):
        if cur != prev + 1:
            ranges.append(str(start) if start == prev else f"{start}-{prev}")
            start = cur
    assert parse_task_list(",".join(ranges)) == tasks
    note = parse_srun_line(f"srun: error: node7: task{'s' if len(tasks) > 1 else ''} {','.join(ranges)}: Killed")
    assert note.tasks == tuple(tasks) and note.node == "node7"


line_text = st.text(st.characters(blacklist_categories=("Cs", "Cc")), max_size=30)


@given(st.lists(st.tuples(st.integers(0, 11), st.sampled_from(["stdout", "stderr"]), line_text), max_size=30),
       st.lists(st.tuples(st.integers(0, 11), st.integers(0, 255)), max_size=12))
def test_step_output_gives_back_each_rank_s_lines_and_reports(lines, exits):
    """Labelled lines come back per rank unchanged; the wrapper's reports become calls, even glued to a line."""
    got, starts, ends = [], [], []
    out = StepOutput(12, lambda r, s, t, e: got.append((r, s, t, e)), lambda r, step, pid: starts.append((r, step, pid)),
                     lambda r, c: ends.append((r, c)))
    width = 2
    for rank, stream, text in lines:
        out.line(stream, f"{rank:>{width}}: {text}")
    for rank, code in exits:
        out.line("stderr", f"{rank:>{width}}: {MARKER}-start 0 {100 + rank}")
        out.line("stderr", f"{rank:>{width}}: no newline{MARKER}-exit {code}")
    assert got[:len(lines)] == [(r, s, t, True) for r, s, t in lines]
    assert got[len(lines):] == [(r, "stderr", "no newline", True) for r, _ in exits]
    assert ends == exits and starts == [(r, "0", 100 + r) for r, _ in exits]


def test_step_output_srun_lines_and_foreign_labels_are_rank_minus_one():
    got = []
    out = StepOutput(2, lambda r, s, t, e: got.append((r, t)), lambda *a: None, lambda *a: None)
    out.line("stderr", "srun: error: node2: task 1: Exited with exit code 3")
    out.line("stdout", "5: a label past the step's size")
    out.line("stderr", f"1: {MARKER}-exit x")   # not a report: plain text
    assert got == [(-1, "srun: error: node2: task 1: Exited with exit code 3"),
                   (-1, "5: a label past the step's size"), (1, f"{MARKER}-exit x")]
    assert [n.kind for n in out.notes] == ["task"] and list(out.own)[0].startswith("srun: error")
