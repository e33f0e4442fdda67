"""``--backend mpi`` as root: refused before mpirun starts, unless Open MPI has been told to allow it."""

from __future__ import annotations

import os
import shutil

import pytest
from hypothesis import given
from hypothesis import strategies as st

from launch_helpers import PY, cli
from mlx_jupyter.launch import LaunchError
from mlx_jupyter.launch.mpi import ROOT_VARS, check_root

ALLOWED = {v: "1" for v in ROOT_VARS}


def test_root_without_the_variables_is_refused_naming_them_and_the_fix():
    with pytest.raises(LaunchError) as err:
        check_root({}, [], euid=0)
    msg = str(err.value)
    assert "OMPI_ALLOW_RUN_AS_ROOT=1 and OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1" in msg
    assert "`--env OMPI_ALLOW_RUN_AS_ROOT=1 --env OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1`" in msg
    assert "export both" in msg and "\n" not in msg
    assert "hostfile's \"envs\"" in msg and "panel" in msg  # what works from the panel, which has no --env


def test_allowed_by_both_variables_or_mpiruns_flag_or_not_root():
    check_root(ALLOWED, [], euid=0)
    check_root({}, ["--allow-run-as-root"], euid=0)
    check_root({}, ["--mca btl self,tcp --allow-run-as-root"], euid=0)
    check_root({}, [], euid=1000)


def test_one_variable_is_not_enough_and_is_named():
    with pytest.raises(LaunchError, match=r"not set to 1: OMPI_ALLOW_RUN_AS_ROOT_CONFIRM\)"):
        check_root({"OMPI_ALLOW_RUN_AS_ROOT": "1"}, [], euid=0)


@given(st.dictionaries(st.sampled_from(ROOT_VARS), st.text(max_size=4)), st.lists(st.text(max_size=30), max_size=3))
def test_only_what_open_mpi_accepts_passes(env, mpi_args):
    """Open MPI wants exactly "1" in both (measured with 4.1.4: "yes" is refused)."""
    words = [w for a in mpi_args for w in a.split()]
    ok = all(env.get(v) == "1" for v in ROOT_VARS) or "--allow-run-as-root" in words or "-allow-run-as-root" in words
    try:
        check_root(env, mpi_args, euid=0)
        assert ok
    except LaunchError:
        assert not ok


needs_root_and_mpirun = pytest.mark.skipif(
    not hasattr(os, "geteuid") or os.geteuid() != 0 or shutil.which("mpirun") is None,
    reason="needs root and Open MPI's mpirun")


@needs_root_and_mpirun
def test_cli_fails_fast_as_root_and_passes_with_env(monkeypatch, tmp_path):
    for v in ROOT_VARS:
        monkeypatch.delenv(v, raising=False)
    marker = tmp_path / "ran"
    code = f"open({str(marker)!r}, 'a').write('x')"
    res = cli(["--backend", "mpi", "-n", "2", PY, "-c", code], timeout=60)
    assert res.returncode == 1 and not marker.exists()
    assert res.stderr.startswith("mlx-jupyter launch: error: --backend mpi as root"), res.stderr
    assert "--env OMPI_ALLOW_RUN_AS_ROOT=1 --env OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1" in res.stderr
    assert "mpirun has detected" not in res.stderr   # ours, before mpirun's
    res = cli(["--backend", "mpi", "-n", "2", *(f"--env={v}=1" for v in ROOT_VARS), PY, "-c", code], timeout=60)
    assert res.returncode == 0, res.stderr
    assert marker.read_text() == "xx"
