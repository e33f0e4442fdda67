"""docs/command-line.md's "Differences from mlx.launch", one test each (the collective API's are in
tests/core/test_mlx_api_parity.py, JACCL's and nccl's environment in tests/launch/test_rank_env_mlx_parity.py)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from mlx_jupyter.hostfile import default_ranks_per_host, parse_host_list
from mlx_jupyter.vocab import rank_env
from mlx_jupyter.launch.contract import plan_ranks
from mlx_jupyter.launch.errors import LaunchError
from mlx_jupyter.launch.launch_config import rank_argv
from mlx_jupyter.launch.local import refuse_unavailable

ROOT = Path(__file__).resolve().parents[2]
CLI = [sys.executable, "-m", "mlx_jupyter", "launch"]


def launch(*args: str, env: dict[str, str] | None = None, cwd: Path | None = None) -> subprocess.CompletedProcess:
    base = {k: v for k, v in os.environ.items() if not k.startswith(("MLX_", "JACCL_", "NCCL_"))}
    return subprocess.run(CLI + list(args), env={**base, **(env or {})}, cwd=cwd, capture_output=True, text=True,
                          timeout=120)


def test_the_section_names_every_difference() -> None:
    text = (ROOT / "docs/command-line.md").read_text().split("## Differences from mlx.launch", 1)[1]
    for phrase in ("`--env KEY` without `=`", "A script runs with `--python`", "`-n` without hosts starts 2 ranks",
                   "refused before any rank starts", "MLX_NCCL_TIMEOUT", "sets no\n  coordinator", "`stream=`",
                   "returns `x`"):
        assert phrase in text, phrase


def test_a_bare_env_key_passes_this_machines_value(tmp_path: Path) -> None:
    p = launch("-n", "1", "--env", "GREETING", "--", "python", "-c", "import os; print(repr(os.environ['GREETING']))",
               env={"GREETING": "hello"}, cwd=tmp_path)
    assert p.returncode == 0 and p.stdout.strip() == "'hello'", p.stderr   # mlx.launch: ''
    p = launch("-n", "1", "--env", "GREETING", "--", "python", "-c", "import os; print('GREETING' in os.environ)",
               cwd=tmp_path)
    assert p.stdout.strip() == "False" and "--env GREETING: is not set here" in p.stderr


def test_a_script_runs_with_the_python_of_the_launch(tmp_path: Path) -> None:
    (tmp_path / "train.py").write_text("print('hi')\n")
    (tmp_path / "run.sh").write_text("#!/bin/sh\necho hi\n")
    (tmp_path / "run.sh").chmod(0o755)
    assert rank_argv(["train.py", "--epochs", "1"], "/py", str(tmp_path)) == ["/py", str(tmp_path / "train.py"),
                                                                              "--epochs", "1"]
    assert rank_argv(["python3", "-V"], "/py") == ["/py", "-V"]
    assert rank_argv(["./run.sh"], "/py", str(tmp_path)) == ["./run.sh"]     # executable, not a .py: as itself
    p = launch("-n", "1", "--", "train.py", cwd=tmp_path)
    assert p.returncode == 0 and p.stdout.strip() == "hi", p.stderr


def test_n_without_hosts_is_two_ranks_here(tmp_path: Path) -> None:
    assert default_ranks_per_host(False) == 2 and default_ranks_per_host(True) == 1
    help_text = subprocess.run(CLI + ["--help"], capture_output=True, text=True, timeout=60).stdout
    assert "2 when none is named" in " ".join(help_text.split())
    p = launch("--", "python", "-c", "import os; print('rank', os.environ['MLX_RANK'])", cwd=tmp_path)
    assert p.returncode == 0 and sorted(p.stdout.split("\n")[:2]) == ["[rank 0] rank 0", "[rank 1] rank 1"], p.stdout


@pytest.mark.parametrize("backend", ["nccl", "jaccl", "jaccl-ring"])
def test_a_backend_this_machine_cannot_run_is_refused_before_any_rank_starts(backend: str, tmp_path: Path) -> None:
    rows = {r["name"]: r for r in __import__("mlx_jupyter.distributed").distributed.backends()}
    if rows[backend]["available"]:
        pytest.skip(f"{backend} can run on this machine")
    marker = tmp_path / "started"
    p = launch("--backend", backend, "-n", "1", "--", "python", "-c", f"open({str(marker)!r}, 'w')", cwd=tmp_path)
    lines = p.stderr.strip().splitlines()
    assert p.returncode != 0 and len(lines) == 1, p.stderr
    assert f"the {backend} backend cannot run on this machine" in lines[0] and "`mlx-jupyter doctor`" in lines[0]
    assert not marker.exists()
    p = launch("--backend", backend, "-n", "1", "--", "python", "-c", f"open({str(marker)!r}, 'w')", cwd=tmp_path,
               env={"MLX_JUPYTER_CHECK_BACKEND": "0"})
    assert marker.exists(), p.stderr                       # the way round a probe that misses a custom install


def test_the_refusal_follows_the_machine_probe() -> None:
    ok = [{"name": "nccl", "available": True, "detail": "NVIDIA driver and libnccl.so.2"}]
    refuse_unavailable("nccl", ok)
    refuse_unavailable("ring", [])                    # built in: never checked
    missing = [{"name": "nccl", "available": False, "detail": "no GPU"}]
    with pytest.raises(LaunchError, match=r"^the nccl backend cannot run on this machine \(no GPU\): see"):
        refuse_unavailable("nccl", missing, environ={})
    refuse_unavailable("nccl", missing, environ={"MLX_JUPYTER_CHECK_BACKEND": "0"})


def test_nccl_gets_our_connect_timeout() -> None:
    plans = plan_ranks("nccl", parse_host_list("127.0.0.1", 2), env={rank_env.CONNECT_TIMEOUT: "30"})
    assert {p.env[rank_env.NCCL_TIMEOUT] for p in plans} == {"30000"}    # mlx.launch: MLX's 300000


def test_jaccl_keeps_the_coordinator_for_launch_and_drops_it_for_clusters() -> None:
    from mlx_jupyter.launch.launch_config import LaunchConfig

    assert LaunchConfig(command=["x"]).jaccl_coordinator
    source = (ROOT / "mlx_jupyter/cluster/engineset.py").read_text()
    assert "jaccl_coordinator=False" in source
