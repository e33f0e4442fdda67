"""One pdb prompt for all ranks from a CONNECTED notebook: a real owner kernel starts 2 ranks, a second real
kernel connects with %mlx_cluster connect; its cells go through the controller, and its prompts through the
ranks' control channel (mlx_debug_request)."""

from __future__ import annotations

import re

import pytest

from tests.cluster.kernel import Kernel
from tests.cluster.test_debug_lockstep import ANSI, Session

pytestmark = pytest.mark.timeout(300)


@pytest.fixture(scope="module")
def kernels():
    owner = Kernel()
    other = None
    try:
        res = owner.run("%load_ext mlx_jupyter\n%mlx_cluster start -n 2", 120)
        assert res.status == "ok", res
        cluster_id = owner.run("import mlx_jupyter.magics as _m\nprint(_m.current().cluster_id)", 10).stdout.strip()
        other = Kernel()
        res = other.run(f"%load_ext mlx_jupyter\n%mlx_cluster connect {cluster_id}", 60)
        assert res.status == "ok" and f"connected to {cluster_id}: 2 ranks" in res.stdout, res
        yield owner, other
    finally:
        if other is not None:
            other.close()
        owner.close()


CELL = "%%mlx_distributed\nr = group.rank()\nbreakpoint()\nx = r * 10\nprint('x is', x)\n"


def test_connected_notebook_gets_one_prompt_for_both_ranks(kernels):
    owner, other = kernels
    s = Session(other, CELL)
    assert s.prompt() == "(Pdb ranks 0-1) "
    head = s.shown(0, "[ranks 0-1] -> x = r * 10")
    assert "--- pdb on ranks 0-1 together" in head, head
    where = owner.run("import mlx_jupyter.magics as _m\n_w = _m.current().where(timeout=5)\n"
                      "print([_w.state(r) for r in range(2)])", 30)
    assert where.stdout.strip() == str(["in pdb (line 4)"] * 2), where  # the owner's where table sees it too
    s.ask("p r", "[rank 0] 0\n[rank 1] 1\n")
    s.ask("n", "[ranks 0-1] -> print('x is', x)")
    s.ask("p x", "[rank 0] 0\n[rank 1] 10\n")
    s.ask("rank 1 p x + 1", "[rank 1] 11")
    res = s.finish("c")
    assert res.status == "ok", res
    out = ANSI.sub("", res.stdout)
    assert re.search(r"\[rank 0\] x is 0\n", out) and re.search(r"\[rank 1\] x is 10\n", out), out
    assert s.prompts == ["(Pdb ranks 0-1) "] * 5, s.prompts
    print("prompt latencies (s):", [round(t, 3) for t in s.latencies])
    assert max(s.latencies) < 2.0, s.latencies  # each prompt came back within 2 s of its answer
    # the owner's notebook still runs cells on the same ranks, and sees what the connected one defined
    res = owner.run("%%mlx_distributed\nprint('owner sees', x)", 60)
    assert res.status == "ok" and "[rank 1] owner sees 10" in ANSI.sub("", res.stdout), res


def test_q_from_the_connected_notebook_stops_every_rank(kernels):
    _, other = kernels
    s = Session(other, "%%mlx_distributed\nv = group.rank()\nbreakpoint()\nw = v + 1\n")
    assert s.prompt() == "(Pdb ranks 0-1) "
    res = s.finish("q")
    assert res.status == "error", res
    assert "BdbQuit" in ANSI.sub("", "\n".join(res.error["traceback"])), res.error
    res = other.run("%%mlx_distributed\nprint('again', group.rank())", 60)
    assert res.status == "ok" and "again" in res.stdout, res


def test_stop_button_in_the_connected_notebook_ends_every_ranks_session(kernels):
    _, other = kernels
    s = Session(other, "%%mlx_distributed\nv = group.rank()\nbreakpoint()\nw = v + 1\n")
    assert s.prompt() == "(Pdb ranks 0-1) "
    res = s.finish(None)
    assert res.status == "error", res
    assert "interrupted by the user" in ANSI.sub("", "\n".join(res.error["traceback"])), res.error
    res = other.run("%%mlx_distributed\nprint('again', group.rank())", 60)
    assert res.status == "ok" and "again" in res.stdout, res


def test_without_stdin_the_ranks_go_on(kernels):
    """A connected notebook that cannot prompt (allow_stdin off): one line says so and the cell completes."""
    _, other = kernels
    res = other.run(CELL, 60)
    assert res.status == "ok", res
    out = ANSI.sub("", res.stdout + res.stderr)
    assert "pdb cannot prompt here" in out and "[rank 1] x is 10" in out, out


def test_mlx_debug_all_from_the_connected_notebook(kernels):
    """After an error on both ranks (cells of the connected notebook), %mlx_debug --all there: one prompt."""
    _, other = kernels
    for rank in range(2):  # one cell per rank: a cell on both would release the slower rank before it raises
        res = other.run(f"%%mlx_distributed -t {rank}\ndef scale(v):\n    secret = v * 3\n    raise ValueError('boom')\n"
                        f"scale(7 if group.rank() == 0 else 8)", 60)
        assert res.status == "error", res
    s = Session(other, "%mlx_debug --all")
    assert s.prompt() == "(Pdb ranks 0-1) "
    s.ask("p secret", "[rank 0] 21\n[rank 1] 24\n")
    res = s.finish("q")
    assert res.status == "ok", res
