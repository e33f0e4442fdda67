"""The magics through a real kernel: a notebook run with nbclient, and the stop button."""

from __future__ import annotations

import os
import re
import threading
import time
from pathlib import Path

import nbformat
import psutil
import pytest
from nbclient import NotebookClient

from tests.cluster.kernel import Kernel

pytestmark = pytest.mark.timeout(150)
HERE = Path(__file__).parent
ANSI = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")


def _tree(pid: int) -> set[int]:
    try:
        return {p.pid for p in psutil.Process(pid).children(recursive=True)}
    except psutil.Error:
        return set()


def stop_leaves_nothing(k: Kernel, kernel_pid: int) -> None:
    """``%mlx_cluster stop`` succeeds and no controller, engine or rank outlives it."""
    assert k.run("%mlx_cluster stop", 30).status == "ok"
    assert not [p for p in _tree(kernel_pid) if psutil.pid_exists(p)]


def _error_text(cell) -> str:
    return "\n".join(ANSI.sub("", "\n".join(o.get("traceback", []))) for o in cell.outputs if o.output_type == "error")


def test_cluster_basics_notebook():
    nb = nbformat.read(HERE / "notebooks" / "cluster_basics.ipynb", as_version=4)
    client = NotebookClient(nb, timeout=60, kernel_name="python3", resources={"metadata": {"path": str(HERE.parent)}})
    client.execute()
    text = "".join(o.get("text", "") for o in nb.cells[1].outputs)
    assert "[rank 0] hello from 0 of 2" in text and "[ranks 0-1] same on every rank" in text
    err = _error_text(nb.cells[4])
    assert "rank 1 raised ZeroDivisionError" in err and "rank 0: stopped" in err
    status = nb.cells[7].outputs[0]["data"]["text/plain"]
    assert "rank" in status and "memory" in status


def test_stop_button_interrupts_every_rank_and_cluster_stays_usable():
    k = Kernel()
    try:
        kernel_pid = k.pid
        assert k.run("%load_ext mlx_jupyter\n%mlx_cluster start -n 2", 60).status == "ok"
        assert k.run("%%mlx_distributed\nimport time, numpy as np, mlx_jupyter.distributed as d", 30).status == "ok"
        for blocked in ("d.all_sum(np.ones(3))", "mx.eval(mx.distributed.all_sum(mx.ones(3)))"):
            armed = {}

            def on_output(name, text):
                if "ARMED" in text and not armed:
                    armed["t"] = time.monotonic()
                    k.interrupt()

            mid = k.submit("%%mlx_distributed\nprint('ARMED', flush=True)\nif world.rank() == 0:\n"
                           f"    {blocked}\nelse:\n    time.sleep(60)")
            res = k.collect(mid, 30, on_output)
            assert armed, res
            assert time.monotonic() - armed["t"] < 2.5
            assert res.status == "error" and "interrupted by the user" in res.traceback
            ok = k.run("%%mlx_distributed\nprint(d.all_sum(np.ones(2)))", 30)
            assert ok.status == "ok" and "[ranks 0-1] [2. 2.]" in ok.stdout, ok
        stop_leaves_nothing(k, kernel_pid)
    finally:
        k.close()


@pytest.mark.parametrize("how", ["SIGSEGV", "SIGKILL"])
def test_a_rank_that_dies_is_named_within_2_s_and_restart_brings_it_back(how):
    """Segfault, or the out-of-memory killer's SIGKILL, in one rank while the other
    waits in a collective: the cell fails at once naming the rank, with the way back."""
    k = Kernel()
    try:
        kernel_pid = k.pid
        assert k.run("%load_ext mlx_jupyter\n%mlx_cluster start -n 2", 60).status == "ok"
        assert k.run("%%mlx_distributed\nimport os, signal, numpy as np, mlx_jupyter.distributed as d", 30).status == "ok"
        t0 = time.monotonic()
        res = k.run("%%mlx_distributed\nprint('in', flush=True)\nif world.rank() == 1:\n"
                    f"    os.kill(os.getpid(), signal.{how})\nd.all_sum(np.ones(3))", 30)
        elapsed = time.monotonic() - t0
        assert res.status == "error", res
        assert elapsed < 2.5 + 0.5, elapsed  # the cell's own start-up included
        assert f"rank 1 died (killed by {how}" in res.traceback, res.traceback
        assert "%mlx_cluster restart" in res.traceback
        if how == "SIGKILL":
            assert "out of memory" in res.traceback
        assert k.run("%mlx_cluster restart", 60).status == "ok"
        ok = k.run("%%mlx_distributed\nprint(mx.distributed.all_sum(mx.ones(2)).tolist())", 30)
        assert ok.status == "ok" and "[ranks 0-1] [2.0, 2.0]" in ok.stdout, ok
        stop_leaves_nothing(k, kernel_pid)
    finally:
        k.close()


def test_noblock_returns_the_run_and_display_shows_it_later():
    k = Kernel()
    try:
        assert k.run("%load_ext mlx_jupyter\n%mlx_cluster start -n 2", 60).status == "ok"
        res = k.run("%%mlx_distributed --noblock\nimport time\ntime.sleep(0.3)\nprint('late', world.rank())", 30)
        assert res.status == "ok", res
        shown = " ".join(d.get("data", {}).get("text/plain", "") for d in res.displays)
        assert "<CellRun on ranks 0-1" in shown and ".display()" in shown, res
        later = k.run("r = _\nr.display(timeout=10)\nprint(repr(r))", 30)
        assert later.status == "ok", later
        assert "[rank 0] late 0" in later.stdout and "[rank 1] late 1" in later.stdout, later
        assert "ended ok" in later.stdout
        assert k.run("%mlx_cluster stop", 30).status == "ok"
    finally:
        k.close()


def test_many_cells_in_one_kernel_keep_answering():
    """Regression: a long session of %%mlx_distributed cells (MLX, our core, plain
    Python) never stops answering. Replies to CellRun's execute requests used to be
    left unread in the client's mux socket now and then (a raw send beside its
    ZMQStream), so a random cell hung for good and every later cell queued behind it."""
    k = Kernel()
    try:
        kernel_pid = k.pid
        assert k.run("%load_ext mlx_jupyter\n%mlx_cluster start -n 2", 60).status == "ok"
        first = k.run("%%mlx_distributed\nimport numpy as np, mlx_jupyter.distributed as d\nn = 0", 30)
        assert first.status == "ok", first
        cells = [
            "%%mlx_distributed\nn += 1",
            "%%mlx_distributed\ns = mx.distributed.all_sum(mx.array([1.0])).item()",
            "%%mlx_distributed\nt = float(d.all_sum(np.ones(1))[0])",
            "%%mlx_distributed --no-init\nn += 1",
        ]
        deadline = time.monotonic() + 45
        done = 0
        while done < 600 and time.monotonic() < deadline:
            code = cells[done % len(cells)]
            try:
                res = k.run(code, 10)
            except TimeoutError as exc:
                pytest.fail(f"cell {done} ({code!r}) never ended; the kernel stopped answering: {exc}")
            assert res.status == "ok", (done, code, res)
            done += 1
        assert done >= 100, f"only {done} cells in 45 s"
        n = sum(1 for i in range(done) if cells[i % len(cells)].endswith("n += 1"))
        got = k.run("got = %mlx_pull n\nprint(got)", 10)
        assert got.status == "ok" and f"[{n}, {n}]" in got.stdout, got
        assert k.run("1 + 1", 10).status == "ok"
        stop_leaves_nothing(k, kernel_pid)
    finally:
        left = _tree(k.pid)
        k.close()
        for pid in left:  # a failed run must not leave the controller or ranks behind
            try:
                psutil.Process(pid).kill()
            except psutil.Error:
                pass
