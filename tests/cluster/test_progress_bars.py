"""Progress bars on ranks through a real kernel: tqdm.auto's text bar and ``\\r`` lines, per rank, in place;
the explicit notebook bars (``tqdm.notebook``, ``tqdm.autonotebook``) fall back to the same text bar."""

from __future__ import annotations

import pytest

from tests.cluster.kernel import cluster_kernel

pytestmark = pytest.mark.timeout(120)

WIDGET_VIEW = "application/vnd.jupyter.widget-view+json"
#: a training loop's two kinds of progress: tqdm.auto, and a print that rewrites its line
CELL = """%%mlx_distributed
import time
from tqdm.auto import tqdm
for i in tqdm(range(5), desc=f"r{world.rank()}", mininterval=0, ascii=True):
    time.sleep(0.1)  # a training step
for i in range(5):
    print(f"\\rstep {i}", end="", flush=True)
    time.sleep(0.1)
"""


@pytest.fixture(scope="module")
def kernel():
    yield from cluster_kernel(2, 60)


def _live(res) -> list[str]:
    """Every text the cell's live displays showed, in order."""
    return [d["data"]["text/plain"] for d in res.displays if "transient" in d and "text/plain" in d.get("data", {})]


def test_tqdm_auto_and_carriage_returns_on_ranks(kernel):
    res = kernel.run(CELL, 60)
    assert res.status == "ok", res
    assert not any(WIDGET_VIEW in d.get("data", {}) for d in res.displays), res.displays  # no "model not found"
    shown = _live(res)
    # tqdm's bar on each rank, labelled, updated in place, then cleared for the final line
    bars = [t for t in shown if "|" in t]
    assert any("[rank 0] r0:" in t for t in bars) and any("[rank 1] r1:" in t for t in bars), shown
    assert any("/5" in t and "5/5" not in t for t in bars), shown  # seen before the end: it updates
    # the finished bars are a success's output (stdout), not on the error stream's background
    assert "[rank 0] r0: 100%|##########| 5/5" in res.stdout and "[rank 1] r1: 100%" in res.stdout, res.stdout
    assert "100%" not in res.stderr, res.stderr
    assert "\r" not in res.stderr and "\r" not in res.stdout
    # the print's \r line keeps its prefix: shown live, and its last value ends the cell
    assert any(t.startswith(("[ranks 0-1] step", "[rank 0] step")) for t in shown), shown
    assert res.stdout.endswith("[ranks 0-1] step 4\n") and res.stdout.count("\n") == 3, res.stdout
    where = {d["transient"]["display_id"] for d in res.displays if "transient" in d
             and d.get("data", {}).get("text/plain", "").startswith(("where the ranks are", "the cell ran"))}
    ids = {d["transient"]["display_id"] for d in res.displays if "transient" in d} - where
    assert len(ids) == 2, ids  # one live display per stream (stderr: tqdm, stdout: the print); where's table aside
    last = {d["transient"]["display_id"]: d.get("data", {}).get("text/plain") for d in res.displays
            if d.get("transient", {}).get("display_id") in ids}
    assert last == dict.fromkeys(ids, ""), (last, shown)  # each live display cleared once its lines were final


#: a cell that asks for tqdm's notebook widget explicitly, in each way tqdm offers it
NOTEBOOK_CELL = """%%mlx_distributed
import time
from tqdm.notebook import tqdm, trange
import tqdm.autonotebook as auto
r = world.rank()
for i in tqdm(range(3), desc=f"nb{r}", mininterval=0, ascii=True):
    time.sleep(0.05)
for i in trange(4, desc=f"tr{r}", mininterval=0, ascii=True, display=True):
    time.sleep(0.05)
for i in auto.tqdm(range(2), desc=f"an{r}", mininterval=0, ascii=True):
    time.sleep(0.05)
"""


def test_tqdm_notebook_falls_back_to_the_text_bar_on_ranks(kernel):
    res = kernel.run(NOTEBOOK_CELL, 60)
    assert res.status == "ok", res
    assert not any(WIDGET_VIEW in d.get("data", {}) for d in res.displays), res.displays  # no widget
    everything = res.stdout + res.stderr + "".join(_live(res))
    for bad in ("model not found", "IProgress", "ImportError", "Error displaying widget", "TqdmKeyError"):
        assert bad not in everything, everything
    for rank in (0, 1):  # each bar's final line, per rank, after its in-place updates
        assert f"[rank {rank}] nb{rank}: 100%|##########| 3/3" in res.stdout, res.stdout
        assert f"[rank {rank}] tr{rank}: 100%|##########| 4/4" in res.stdout, res.stdout
        assert f"[rank {rank}] an{rank}: 100%|##########| 2/2" in res.stdout, res.stdout
    shown = [t for t in _live(res) if "|" in t]
    assert any("nb0:" in t and "3/3" not in t for t in shown), shown  # updated in place before the end
    assert "\r" not in res.stderr
