"""A recorded cluster's folder that is not there is refused with where the examples are (issue 45 §8: the
docs' snippet, run from notebooks/, ended in a 7-frame FileNotFoundError naming only the relative path)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from mlx_jupyter.topology import Topology
from mlx_jupyter.topology.recordings import RecordingsNotFound, examples_folder

EXAMPLES = Path(__file__).resolve().parents[1] / "fixtures" / "thunderbolt"


def test_the_examples_are_found_from_any_working_folder(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert examples_folder() == EXAMPLES
    assert Topology.from_recordings(examples_folder() / "four-macs-broken-mesh").names == [f"m3-ultra-{i}" for i in range(1, 5)]


def test_a_relative_folder_from_elsewhere_is_refused_naming_the_examples_full_path(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(RecordingsNotFound) as info:
        Topology.from_recordings("tests/fixtures/thunderbolt/four-macs-broken-mesh")
    msg = str(info.value)
    assert msg.startswith(f"no recorded cluster at tests/fixtures/thunderbolt/four-macs-broken-mesh (from {tmp_path}): "
                          f"the recorded examples are in {EXAMPLES} (cable-to-foreign-mac, "), msg
    assert msg.endswith(f"e.g. Topology.from_recordings({str(EXAMPLES / 'four-macs-broken-mesh')!r})"), msg
    assert isinstance(info.value, FileNotFoundError)
    with pytest.raises(RecordingsNotFound, match=r"^no recorded cluster at /nowhere/x: .*e\.g\. Topology\.from_recordings"):
        Topology.from_recordings("/nowhere/x")
    assert os.getcwd() == str(tmp_path)
