"""One pdb prompt for all ranks (lockstep): a real kernel with 4 local ranks, whose input_requests the test answers."""

from __future__ import annotations

import os
import queue
import re
import time
from typing import Optional

import pytest

from tests.cluster.kernel import CellResult, Kernel, cluster_kernel, works

ANSI = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")
#: a group timeout shorter than the pause the test holds the ranks at the prompt
GROUP_TIMEOUT = 3.0
#: how long the ranks are held at the prompt (s): longer than the timeout; the issue's 10 minutes is too slow for
#: every run: MLX_JUPYTER_TEST_PDB_PAUSE=600 runs it (the timeout below grows with it)
PAUSE = float(os.environ.get("MLX_JUPYTER_TEST_PDB_PAUSE", GROUP_TIMEOUT + 2))
pytestmark = pytest.mark.timeout(240 + PAUSE)


class Session:
    """A cell run with stdin allowed: each prompt answered with the next line; how long each answer took."""

    def __init__(self, k: Kernel, code: str):
        self.k, self.res, self.prompts, self.latencies = k, CellResult(), [], []
        self.msg_id = k.kc.execute(code, allow_stdin=True)
        self.sent_at: Optional[float] = None
        self.idle = False

    def prompt(self, timeout: float = 60) -> str:
        """The next prompt (fails after ``timeout`` s or if the cell ends first)."""
        deadline = time.monotonic() + timeout
        while True:
            assert time.monotonic() < deadline, f"no prompt within {timeout} s; so far: {self.res}"
            try:
                msg = self.k.kc.get_stdin_msg(timeout=0.02)
            except queue.Empty:
                msg = None
            if msg is not None and msg["msg_type"] == "input_request":
                if self.sent_at is not None:
                    self.latencies.append(time.monotonic() - self.sent_at)
                self.prompts.append(msg["content"]["prompt"])
                return self.prompts[-1]
            assert not self.idle, f"the cell ended without a prompt: {self.res}"
            self.idle = self.k.drain(self.msg_id, self.res)

    def answer(self, line: str) -> None:
        self.sent_at = time.monotonic()
        self.k.kc.input(line)

    def ask(self, line: str, expect: str) -> str:
        """Answer the prompt with ``line``; the output shown since (ANSI removed), once it holds ``expect``
        (the kernel's output and its next prompt come on different channels, in either order)."""
        before = len(self.res.stdout)
        self.answer(line)
        self.prompt()
        return self.shown(before, expect)

    def shown(self, since: int, expect: str, timeout: float = 10) -> str:
        deadline = time.monotonic() + timeout
        while True:
            out = ANSI.sub("", self.res.stdout[since:])
            if expect in out:
                return out
            assert time.monotonic() < deadline, f"{expect!r} not shown within {timeout} s: {out!r}"
            self.idle = self.k.drain(self.msg_id, self.res) or self.idle
            time.sleep(0.02)

    def finish(self, line: Optional[str], timeout: float = 60) -> CellResult:
        """Answer the prompt with ``line`` (None: press the stop button instead); the cell's result."""
        if line is None:
            self.k.interrupt()
        else:
            self.answer(line)
        deadline = time.monotonic() + timeout
        while not self.idle:
            assert time.monotonic() < deadline, f"the cell did not end within {timeout} s: {self.res}"
            try:
                msg = self.k.kc.get_stdin_msg(timeout=0.02)
                raise AssertionError(f"an unexpected prompt {msg['content'].get('prompt')!r}: {self.res.stdout}")
            except queue.Empty:
                pass
            self.idle = self.k.drain(self.msg_id, self.res)
        self.res.status = self.k.reply(self.msg_id)["content"]["status"]
        return self.res


@pytest.fixture(scope="module")
def kernel():
    yield from cluster_kernel(4, 120)


LOSS_CELL = f"""%%mlx_distributed
import numpy as np
from mlx_jupyter import distributed as dist
loss = float('nan') if group.rank() == 3 else 3.0
before = int(dist.all_sum(np.array([1]), group=group, timeout={GROUP_TIMEOUT})[0])
breakpoint()
total = int(dist.all_sum(np.array([group.rank() + 1]), group=group, timeout={GROUP_TIMEOUT})[0])
print('total', total, 'before', before)
"""


def test_one_prompt_finds_the_nan_rank_and_the_group_survives_a_long_pause(kernel):
    """4 ranks stop at breakpoint(): one prompt; `p loss` names rank 3's nan in one command; every prompt
    answers within 2 s; held at the prompt longer than the group's timeout, all_sum still works after `n`."""
    cluster_id = kernel.run("import mlx_jupyter.magics as _m\nprint(_m.current().cluster_id)", 10).stdout.strip()
    from mlx_jupyter.cluster import Cluster

    other = Cluster.connect(cluster_id, timeout=30)  # where() from another process, as the lab panel asks
    try:
        s = Session(kernel, LOSS_CELL)
        assert s.prompt() == "(Pdb ranks 0-3) "
        head = s.shown(0, "[ranks 0-3] -> total = ")
        assert "--- pdb on ranks 0-3 together" in head, head
        where = other.where(timeout=5)
        assert [where.state(r) for r in range(4)] == ["in pdb (line 7)"] * 4, where
        s.ask("p loss", "[ranks 0-2] 3.0\n[rank 3] nan\n")  # the nan rank, found in one command
        out = s.ask("rank 3 p loss * 2", "[rank 3] nan")
        assert "ranks 0-2" not in out, out
        s.ask("rank 1 n", "'n' moves ranks")  # refused: one rank must not run on alone into the all_sum
        paused = time.monotonic()
        while time.monotonic() - paused < PAUSE:  # the pause under test: longer than the group's timeout
            time.sleep(0.2)
        s.ask("n", "[ranks 0-3] -> print('total', total, 'before', before)")  # every rank runs the all_sum at once
        s.ask("p total", "[ranks 0-3] 10")
        res = s.finish("c")
    finally:
        other.stop()
    assert res.status == "ok", res
    assert "[ranks 0-3] total 10 before 4" in ANSI.sub("", res.stdout), res.stdout
    assert s.prompts == ["(Pdb ranks 0-3) "] * 6, s.prompts
    assert max(s.latencies) < 2.0, s.latencies  # each prompt came back within 2 s of its answer
    works(kernel, 4, 60)


def all_idle(k: Kernel, timeout: float = 60) -> None:
    """Wait (bounded) until every rank is idle: on a loaded machine a rank may format its traceback for longer
    than the run's release deadline (2 s), and the next cell is refused until it is done."""
    deadline = time.monotonic() + timeout
    while True:
        res = k.run("import mlx_jupyter.magics as _m\n_w = _m.current().where(timeout=5)\n"
                    "print([_w.state(r) for r in range(4)])", 30)
        if res.stdout.strip() == str(["idle"] * 4):
            return
        assert time.monotonic() < deadline, f"ranks not idle within {timeout} s: {res.stdout}"
        time.sleep(0.5)


def test_q_stops_every_rank_cleanly(kernel):
    s = Session(kernel, "%%mlx_distributed\nv = group.rank()\nbreakpoint()\nw = v + 1\n")
    assert s.prompt() == "(Pdb ranks 0-3) "
    assert "[ranks 0-3] > <cell>(4)<module>()" in s.shown(0, "-> w = v + 1")
    res = s.finish("q")
    assert res.status == "error", res
    assert "raised BdbQuit: pdb was quit (q)" in ANSI.sub("", "\n".join(res.error["traceback"])), res.error
    all_idle(kernel)
    works(kernel, 4, 60)


def test_stop_button_ends_every_ranks_session(kernel):
    s = Session(kernel, "%%mlx_distributed\nv = group.rank()\nbreakpoint()\nw = v + 1\n")
    assert s.prompt() == "(Pdb ranks 0-3) "
    res = s.finish(None)
    assert res.status == "error", res
    assert "interrupted by the user" in ANSI.sub("", "\n".join(res.error["traceback"])), res.error
    all_idle(kernel)
    works(kernel, 4, 60)


RAISE_CELL = """%%mlx_distributed -t {rank}
def scale(v):
    secret = v * 3
    raise ValueError(f"boom {{secret}}")
scale(7 if group.rank() < 3 else 8)
"""


def ranks_that_showed(text: str, line: str) -> list[int]:
    """The ranks of every ``[rank(s) …] line`` in ``text``, a rank as often as its line shows."""
    from mlx_jupyter.cluster.cells.targets import parse_targets

    labels = re.findall(rf"^\[ranks? ([0-9,-]+)\] {re.escape(line)}$", text, re.M)
    return sorted(r for label in labels for r in parse_targets(label, 64))


def raise_on_every_rank(k: Kernel) -> None:
    """Each rank raises in scale(), in a cell of its own (one cell on all would abort the slower ranks
    before they raise, on a loaded machine: their last traceback would be that interrupt)."""
    for rank in range(4):
        assert k.run(RAISE_CELL.format(rank=rank), 60).status == "error"


def test_mlx_debug_all_after_an_error(kernel):
    raise_on_every_rank(kernel)
    s = Session(kernel, "%mlx_debug --all")
    assert s.prompt() == "(Pdb ranks 0-3) "
    s.ask("p secret", "[ranks 0-2] 21\n[rank 3] 24\n")
    res = s.finish("q")
    assert res.status == "ok", res
    works(kernel, 4, 60)


def test_mlx_debug_all_with_commands_groups_the_answers(kernel):
    raise_on_every_rank(kernel)
    res = kernel.run('%mlx_debug --all -c "p secret"', 60)
    assert res.status == "ok", res
    out = ANSI.sub("", res.stdout)
    assert "[ranks 0-2] 21" in out and "[rank 3] 24" in out, out
    assert "[ranks 0-3] > <cell>(4)scale()" in out and "[ranks 0-3] (Pdb) p secret" in out, out
    assert kernel.run("%mlx_debug 1 --all", 10).status == "error"


def test_from_a_connected_notebook(kernel, capsys):
    """A second handle (a connected notebook's): the post-mortem commands on every rank grouped; a breakpoint,
    whose cell comes through the controller there, reaches its front end over the control channel (which cannot
    prompt here, in plain Python: one line, the ranks go on; tests/cluster/test_debug_connected.py prompts);
    Cluster.execute, which shows no prompts, gets the breakpoint skipped after the ranks' wait for a prompt."""
    raise_on_every_rank(kernel)
    cluster_id = kernel.run("import mlx_jupyter.magics as _m\nprint(_m.current().cluster_id)", 10).stdout.strip()
    from mlx_jupyter.cluster import Cluster
    from mlx_jupyter.cluster.cells.display import show_run

    other = Cluster.connect(cluster_id, timeout=30)
    try:
        capsys.readouterr()
        code = ("__import__('mlx_jupyter.cluster.rank.debugger', fromlist=['post_mortem'])"
                ".post_mortem('p secret', grouped=True)")
        show_run(other.run(code, None, init=False), live=False, timeout=60)
        show_run(other.run("breakpoint()\nprint('after')", None, init=False), live=False, timeout=60)
        out = capsys.readouterr()
        other.execute("breakpoint()\nprint('later')", targets=[1], init=False, timeout=60)
        executed = capsys.readouterr()
    finally:
        other.stop()
    text = out.out + out.err
    assert "[ranks 0-2] 21" in text and "[rank 3] 24" in text, text
    assert "[ranks 0-3] -> print('after')" in text, text
    assert text.count("ranks 0-3: pdb cannot prompt here") == 1, text
    assert ranks_that_showed(text, "after") == [0, 1, 2, 3], text   # each once (grouped unless a rank's line stalled)
    text = executed.out + executed.err
    assert "[rank 1] breakpoint() skipped: this cell came through the controller and its sender does not show" \
           in text and "[rank 1] later" in text, text
    works(kernel, 4, 60)
