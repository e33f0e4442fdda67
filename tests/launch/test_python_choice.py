"""Which Python a rank runs: a bare `python`/`python3` is the launcher's (or --python), whatever the PATH
says; a rank that fails on a missing module is summarised with the interpreter that ran."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from launch_helpers import PY, cli
from mlx_jupyter.launch.launch_config import interpreter_of, rank_argv

pytestmark = pytest.mark.timeout(120)


def test_bare_python_means_the_given_interpreter() -> None:
    assert rank_argv(["python", "-c", "pass"], "/venv/bin/python") == ["/venv/bin/python", "-c", "pass"]
    assert rank_argv(["python3", "-m", "x"], "/venv/bin/python") == ["/venv/bin/python", "-m", "x"]
    assert rank_argv(["python3.9", "-c", "pass"], "/py") == ["python3.9", "-c", "pass"]   # a version asked for
    assert rank_argv(["/usr/bin/python3", "-c", "pass"], "/py") == ["/usr/bin/python3", "-c", "pass"]
    assert interpreter_of(["echo", "hi"], True) is None
    assert interpreter_of(["python3.9"], False) == "python3.9"


def test_a_path_python_without_mlx_is_not_used(tmp_path: Path) -> None:
    """A PATH whose `python` cannot import mlx (an unactivated venv): the ranks still run the launcher's."""
    shim = tmp_path / "bin"
    shim.mkdir()
    for name in ("python", "python3"):
        (shim / name).write_text("#!/bin/sh\necho 'the PATH python ran' >&2\nexit 9\n")
        (shim / name).chmod(0o755)
    env = {"PATH": f"{shim}{os.pathsep}{os.environ['PATH']}"}
    code = "import sys, mlx.core; print('ran', sys.executable)"
    for bare in ("python", "python3"):
        p = cli(["-n", "2", "--", bare, "-c", code], env=env)
        assert p.returncode == 0, p.stderr
        assert p.stdout.count(f"ran {PY}") == 2, p.stdout
    p = cli(["-n", "1", "--python", str(shim / "python"), "--", "python", "-c", code], env=env)
    assert p.returncode == 9 and "the PATH python ran" in p.stderr   # --python says otherwise


def test_a_missing_module_names_the_interpreter_that_ran() -> None:
    p = cli(["-n", "2", "--", "python", "-c", "import no_such_module_here"])
    assert p.returncode == 1
    summary = p.stderr.strip().splitlines()[-1]
    assert f"(No module named 'no_such_module_here'; the rank ran {PY})" in summary, summary
    p = cli(["--python", "/nonexistent/python", "--", PY, "-c", "import no_such_module_here"])
    summary = p.stderr.strip().splitlines()[-1]
    assert f"the rank ran {PY}; --python is /nonexistent/python)" in summary, summary
