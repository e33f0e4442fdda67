"""The topology widget's Save hostfile and Start cluster say where the hostfile went: a relative path
(the default `hostfile.json`) is in the kernel's working directory, shown in full."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

pytest.importorskip("anywidget")

from mlx_jupyter.widgets import TopologyWidget

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "thunderbolt"


class FakeCluster:
    size, running = 4, True

    def __init__(self, hostfile: str, backend: str) -> None:
        self.hostfile, self.backend = hostfile, backend

    def start(self, progress=None, **kw) -> None:
        progress(4, 4)


def test_start_cluster_says_where_it_wrote_the_hostfile(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from mlx_jupyter import magics

    monkeypatch.chdir(tmp_path)   # the kernel's working directory: the notebook's folder
    w = TopologyWidget.from_recordings(FIXTURES / "four-m3-ultra-mesh", cluster_factory=FakeCluster)
    assert w.hostfile_path == "hostfile.json"
    messages = []
    w.observe(lambda ch: messages.append(ch["new"]["message"]), "status")
    previous = magics.set_current(None)
    try:
        cluster = w.start_cluster()
    finally:
        magics.set_current(previous)
    written = tmp_path / "hostfile.json"
    assert cluster.hostfile == str(written) and json.loads(written.read_text())["backend"] == "jaccl"
    assert f"wrote {written}; starting a cluster on it" in messages
    assert w.status["message"] == f"4 ranks ready (jaccl) on hostfile {written}; use %%mlx_distributed"
    assert w.save_hostfile("other.json") == tmp_path / "other.json"
    assert w.status["message"].startswith(f"wrote {tmp_path / 'other.json'} (backend jaccl, 4 hosts)")
