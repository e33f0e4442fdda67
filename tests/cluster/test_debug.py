"""pdb on one rank from the notebook: a real kernel whose input_requests the test answers."""

from __future__ import annotations

import queue
import re
import time
from typing import Callable, Optional, Union

import pytest

from tests.cluster.kernel import CellResult, Kernel, cluster_kernel, works

pytestmark = pytest.mark.timeout(180)
ANSI = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")
#: an answer that presses the stop button instead of typing a line
STOP = object()
Answer = Union[str, object]


def run_answering(k: Kernel, code: str, answers: list[Answer], timeout: float = 60) -> tuple[CellResult, list[str]]:
    """Run ``code`` with stdin allowed, answering each input_request with the next of ``answers``.

    Returns the cell's result and the prompts asked; fails if a prompt comes with no answer left.
    """
    msg_id = k.kc.execute(code, allow_stdin=True)
    res, prompts = CellResult(), []
    deadline = time.monotonic() + timeout
    idle = False
    while not idle:
        assert time.monotonic() < deadline, f"cell did not finish within {timeout} s; so far: {res} {prompts}"
        try:
            msg = k.kc.get_stdin_msg(timeout=0.02)
        except queue.Empty:
            msg = None
        if msg is not None and msg["msg_type"] == "input_request":
            prompts.append(msg["content"]["prompt"])
            assert answers, f"an unexpected prompt {prompts[-1]!r}; output so far: {res.stdout}"
            answer = answers.pop(0)
            if answer is STOP:
                k.interrupt()
            else:
                k.kc.input(str(answer))
        idle = k.drain(msg_id, res)
    res.status = k.reply(msg_id)["content"]["status"]
    return res, prompts


@pytest.fixture(scope="module")
def kernel():
    yield from cluster_kernel(2, 90)


BREAK_CELL = """%%mlx_distributed
x = 10 * (group.rank() + 1)
if group.rank() == 1:
    breakpoint()
y = x + 1
total = mx.distributed.all_sum(mx.array([y]), group=world).item()
print('rank', group.rank(), 'y', y, 'total', total)
"""


def test_breakpoint_step_print_continue(kernel):
    res, prompts = run_answering(kernel, BREAK_CELL, ["n", "p y", "c"])
    assert res.status == "ok", (res, prompts)
    assert prompts == ["(Pdb rank 1) "] * 3
    out = ANSI.sub("", res.stdout)
    assert "--- pdb on rank 1" in out and "timeouts still apply" in out
    assert "-> y = x + 1" in out  # where breakpoint() stopped
    assert re.search(r"^21$", out, re.M), out  # p y after n
    assert "[rank 0] rank 0 y 11 total 32" in out and "[rank 1] rank 1 y 21 total 32" in out, out
    works(kernel, 2, 30)


def test_no_stdin_goes_on_with_one_line(kernel):
    res = kernel.run(BREAK_CELL, 30)  # allow_stdin=False, as nbclient runs a notebook
    assert res.status == "ok", res
    assert "rank 1: pdb cannot prompt here" in res.stdout
    assert "[rank 1] rank 1 y 21 total 32" in res.stdout


def test_quit_leaves_the_cluster_usable(kernel):
    code = "%%mlx_distributed\nimport pdb\nif group.rank() == 1:\n    pdb.set_trace()\n    v = 1\n"
    res, prompts = run_answering(kernel, code, ["q"])  # pdb.set_trace() as breakpoint()
    assert prompts == ["(Pdb rank 1) "]
    assert "rank 1 raised BdbQuit: pdb was quit (q)" in ANSI.sub("", "\n".join(res.error["traceback"])), res.error
    works(kernel, 2, 30)


def test_ranks_that_stop_together_share_one_prompt(kernel):
    """Both ranks stop: one prompt for both, a command goes to each, the answers grouped (lockstep)."""
    code = "%%mlx_distributed\nv = group.rank() * 5\nbreakpoint()\nw = v + 1\nprint('w', w)\n"
    res, prompts = run_answering(kernel, code, ["p v", "c"])
    assert res.status == "ok", res
    assert prompts == ["(Pdb ranks 0-1) "] * 2, prompts
    out = ANSI.sub("", res.stdout)
    assert "--- pdb on ranks 0-1 together" in out and "[rank 0] 0\n[rank 1] 5\n" in out, out
    assert "[rank 0] w 1" in out and "[rank 1] w 6" in out, out


def test_stop_button_ends_the_session(kernel):
    code = "%%mlx_distributed\nimport time\nif group.rank() == 1:\n    breakpoint()\n    v = 1\n"
    res, prompts = run_answering(kernel, code, [STOP], timeout=30)
    assert prompts == ["(Pdb rank 1) "]
    assert res.status == "error", res
    assert "interrupted by the user" in ANSI.sub("", "\n".join(res.error["traceback"])), res.error
    works(kernel, 2, 30)


RAISE_CELL = """%%mlx_distributed
def scale(v):
    secret = v * 3
    raise ValueError(f"boom {secret}")
if group.rank() == 1:
    scale(7)
"""


def test_post_mortem_default_rank_interactive(kernel):
    assert kernel.run(RAISE_CELL, 30).status == "error"
    res, prompts = run_answering(kernel, "%mlx_debug", ["p secret", "p v", "q"])
    assert res.status == "ok", res
    assert prompts == ["(Pdb rank 1) "] * 3
    out = ANSI.sub("", res.stdout)
    assert "scale()" in out and "raise ValueError" in out, out
    assert re.search(r"^21$", out, re.M) and re.search(r"^7$", out, re.M), out
    works(kernel, 2, 30)


def test_post_mortem_commands(kernel):
    assert kernel.run(RAISE_CELL, 30).status == "error"
    res = kernel.run('%mlx_debug 1 -c "p locals()"', 30)
    assert res.status == "ok", res
    assert "'secret': 21" in res.stdout and "'v': 7" in res.stdout, res.stdout
    assert "(Pdb rank 1) p locals()" in res.stdout


WAIT_ON_PDB_CELL = """%%mlx_distributed
import numpy as np
from mlx_jupyter import distributed as dist
if group.rank() == 1:
    breakpoint()
total = dist.all_sum(np.array([group.rank() + 1]), group=group, timeout=60)
print('total', int(total[0]))
"""
#: the live table's rows while rank 1 sits at its prompt and rank 0 waits for it in all_sum (timeout=60)
IN_PDB = re.compile(r"^1\s+in pdb \(line 6\)", re.M)
WAITING_ON_PDB = re.compile(r"^0\s+in all_sum #\d+ at line 6 waiting on rank 1 \(in pdb\) for \d+\.\d s; "
                            r"times out after 60 s", re.M)


def test_the_live_table_and_where_name_the_rank_in_pdb_and_the_timeout_of_who_waits(kernel):
    """Rank 1 stops at breakpoint(), rank 0 blocks in all_sum on it: while the prompt waits, the table under
    the cell and where() from another process (as the lab panel asks) say so; then c lets both finish."""
    cluster_id = kernel.run("import mlx_jupyter.magics as _m\nprint(_m.current().cluster_id)", 10).stdout.strip()
    from mlx_jupyter.cluster import Cluster

    other = Cluster.connect(cluster_id, timeout=30)  # a second handle, as the panel's server holds
    try:
        msg_id = kernel.kc.execute(WAIT_ON_PDB_CELL, allow_stdin=True)
        res, prompts, tables = CellResult(), [], []

        def keep_table(msg: dict) -> None:
            if msg["msg_type"] in ("display_data", "update_display_data"):
                tables.append(msg["content"].get("data", {}).get("text/plain", ""))

        where = None
        deadline = time.monotonic() + 45
        idle = False
        while not idle:
            assert time.monotonic() < deadline, f"no table naming the rank in pdb; tables {tables[-2:]}, {res}"
            try:
                msg = kernel.kc.get_stdin_msg(timeout=0.02)
                prompts.append(msg["content"]["prompt"])
            except queue.Empty:
                pass
            idle = kernel.drain(msg_id, res, keep_table)
            seen = next((t for t in tables if IN_PDB.search(t) and WAITING_ON_PDB.search(t)), None)
            if prompts and seen and where is None:
                where = other.where(timeout=5)
                kernel.kc.input("c")
        reply = kernel.reply(msg_id)
    finally:
        other.stop()
    assert reply["content"]["status"] == "ok", (res, tables[-1:])
    assert prompts == ["(Pdb rank 1) "], prompts
    out = ANSI.sub("", res.stdout)
    assert "[ranks 0-1] total 3" in out, out
    assert seen and "rank 1 is in pdb (line 6)" in seen, seen  # the one-line diagnosis too
    assert where.state(1) == "in pdb (line 6)", where
    assert re.match(r"in all_sum #\d+ at line 6 waiting on rank 1 \(in pdb\) for \d+\.\d s; times out after 60 s$",
                    where.state(0)), where
    works(kernel, 2, 30)


def test_post_mortem_shows_in_where_as_the_raising_frame(kernel):
    """%mlx_debug's prompt waiting on rank 1: where() from another process says post-mortem, in scale()."""
    assert kernel.run(RAISE_CELL, 30).status == "error"
    cluster_id = kernel.run("import mlx_jupyter.magics as _m\nprint(_m.current().cluster_id)", 10).stdout.strip()
    from mlx_jupyter.cluster import Cluster

    other = Cluster.connect(cluster_id, timeout=30)
    try:
        msg_id = kernel.kc.execute("%mlx_debug 1", allow_stdin=True)
        prompt = kernel.kc.get_stdin_msg(timeout=30)
        assert prompt["content"]["prompt"] == "(Pdb rank 1) ", prompt
        where = other.where(timeout=5)
        kernel.kc.input("q")
        kernel.reply(msg_id, 30)
    finally:
        other.stop()
    assert where.state(1) == "in pdb post-mortem (line 4 in scale)", where  # the raise, in scale()
    works(kernel, 2, 30)


LINES_CELL = """%%mlx_distributed
v = group.rank()
if v == 1:
    raise ValueError('raised at line 4')
"""
SLEEP_CELL = "%%mlx_distributed --noblock\nimport time\nif group.rank() == 0:\n    time.sleep(60)\n"
#: where() until rank 0 is seen at its sleep (a probe with a deadline), then the run interrupted
WHERE_SLEEP = ("import time, mlx_jupyter.magics as _m\nhung = _\nstate, deadline = '', time.monotonic() + 20\n"
               "while 'sleep' not in state and time.monotonic() < deadline:\n"
               "    state = _m.current().where(timeout=5).state(0)\n"
               "hung.interrupt()\nhung.wait(30)\nprint(state)")


def test_a_cells_line_is_the_editors_in_the_traceback_pdb_and_where(kernel):
    """The editor shows %%mlx_distributed on line 1: the raise on its line 4 is line 4 in the rank's
    traceback and in pdb, and a rank sleeping on line 4 is at line 4 in the where table."""
    res = kernel.run(LINES_CELL, 30)
    assert res.status == "error", res
    tb = ANSI.sub("", "\n".join(res.error["traceback"]))
    assert re.search(r"Cell In\[\d+\], line 4\b", tb) and "line 3" not in tb, tb
    res = kernel.run('%mlx_debug 1 -c "where"', 30)
    out = ANSI.sub("", res.stdout)
    assert re.search(r"\(4\)<module>\(\)\n(\[rank 1\] )?-> raise ValueError", out), out
    assert kernel.run(SLEEP_CELL, 30).status == "ok"
    res = kernel.run(WHERE_SLEEP, 60)
    assert res.status == "ok" and "line 4: time.sleep(60)" in res.stdout, res
    works(kernel, 2, 30)
