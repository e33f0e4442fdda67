"""`mlx-jupyter doctor` reports a JACCL launch with and without a coordinator (MLX's coordinator is optional)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest


def doctor(extra: dict[str, str], *args: str) -> str:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("MLX_", "JACCL_", "OMPI_", "PMI_", "NCCL_"))}
    p = subprocess.run([sys.executable, "-m", "mlx_jupyter", "doctor", *args], env={**env, **extra},
                       capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stderr
    return p.stdout


@pytest.mark.parametrize("names", [("JACCL_IBV_DEVICES", "JACCL_RANK", "JACCL_COORDINATOR"),
                                   ("MLX_IBV_DEVICES", "MLX_RANK", "MLX_JACCL_COORDINATOR")])
def test_jaccl_with_and_without_a_coordinator(names: tuple[str, str, str]) -> None:
    devices, rank, coordinator = names
    base = {devices: "/tmp/devices.json", rank: "1"}
    out = doctor({**base, coordinator: "10.0.0.1:32323"})
    assert f"jaccl: launched: rank 1, devices {devices}=/tmp/devices.json, coordinator {coordinator}=10.0.0.1:32323" in out
    out = doctor(base)
    assert "jaccl: launched without a coordinator: rank 1" in out and "all_gather_factory" in out
    out = doctor({**base, "MLX_JUPYTER_HOSTFILE": "/tmp/core.json"})
    assert "the bootstrap runs over mlx-jupyter's signed ring (MLX_JUPYTER_HOSTFILE=/tmp/core.json)" in out
    rows = {r["name"]: r for r in json.loads(doctor(base, "--json"))}
    assert rows["jaccl"]["launch"].startswith("launched without a coordinator") and rows["ring"]["launch"] == ""


def test_a_plain_process_is_no_launch() -> None:
    assert "this process's launch environment: none" in doctor({})
    assert "mpi" not in doctor({"OMPI_COMM_WORLD_SIZE": "1"}).split("launch environment")[1]
