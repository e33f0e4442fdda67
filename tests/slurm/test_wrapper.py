"""The task wrapper, run by /bin/sh as srun would (Slurm's variables set by hand), and the step plan (pure)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from mlx_jupyter.launch.contract import ContractError
from mlx_jupyter.launch.slurm.options import SlurmOptions, allocation_argv, in_step, inside_allocation, step_argv
from mlx_jupyter.launch.slurm.plan import CORE_PORT_OFFSET, PORT_BASE, derived_port, plan_step, rank_hosts
from mlx_jupyter.launch.slurm.wrapper import MARKER, wrapper_argv

NODES = ["node1", "node2"]
HOSTS = rank_hosts(NODES, {"node1": "10.9.0.11", "node2": "10.9.0.12"}, 2)
SHOW = ("import json, os, sys; print(json.dumps({k: os.environ.get(k) for k in sys.argv[1:]} | "
        "{'hostfile': open(os.environ['MLX_HOSTFILE']).read() if 'MLX_HOSTFILE' in os.environ else None, "
        "'path': os.environ.get('MLX_HOSTFILE')}))")


def run_task(env: dict, rank: int, node: str, command: list[str], local_id: int = 0, **slurm) -> subprocess.CompletedProcess:
    task_env = {**os.environ, **env, "SLURM_PROCID": str(rank), "SLURMD_NODENAME": node,
                "SLURM_LOCALID": str(local_id), "SLURM_STEP_ID": "0", **slurm}
    return subprocess.run(wrapper_argv(command), env=task_env, capture_output=True, text=True, timeout=30)


def temp_files() -> set[Path]:
    return set(Path(os.environ.get("TMPDIR", "/tmp")).glob("mlx-jupyter.*"))


def test_each_rank_gets_its_contract_and_nothing_of_the_wrapper():
    plan = plan_step("ring", HOSTS, env={"USER_VAR": "x"}, token="secret-token", starting_port=20000)
    before = temp_files()
    for rank in range(4):
        res = run_task(plan.env, rank, NODES[rank // 2], [sys.executable, "-c", SHOW, "MLX_RANK", "USER_VAR",
                                                          "MLX_JUPYTER_TOKEN", "MLX_JUPYTER_SLURM_NODES",
                                                          "MLX_JUPYTER_SLURM_WRAPPER", "MLX_JUPYTER_SLURM_FILE_MLX_HOSTFILE"])
        assert res.returncode == 0, res.stderr
        got = json.loads(res.stdout)
        assert got["MLX_RANK"] == str(rank) and got["USER_VAR"] == "x" and got["MLX_JUPYTER_TOKEN"] == "secret-token"
        assert got["MLX_JUPYTER_SLURM_NODES"] is None and got["MLX_JUPYTER_SLURM_WRAPPER"] is None
        assert got["MLX_JUPYTER_SLURM_FILE_MLX_HOSTFILE"] is None
        assert json.loads(got["hostfile"]) == [[f"10.9.0.1{1 + r // 2}:{20000 + r}"] for r in range(4)]
        assert got["path"].startswith("/proc/self/fd/")   # the file itself is already gone
        start, end, rest = res.stderr.split("\n")   # (str.splitlines would also split at the marker's \x1e)
        assert start.startswith(f"{MARKER}-start 0 ") and end == f"{MARKER}-exit 0" and rest == ""
    assert temp_files() == before


def test_exit_codes_and_signals_are_reported_and_returned():
    plan = plan_step("ring", HOSTS[:1], env={}, token="t", starting_port=20000)
    res = run_task(plan.env, 0, "node1", ["sh", "-c", "printf 'no newline' >&2; exit 7"])
    assert res.returncode == 7 and res.stderr.endswith(f"no newline{MARKER}-exit 7\n")
    res = run_task(plan.env, 0, "node1", ["sh", "-c", "kill -TERM $$"])
    assert res.returncode == 128 + signal.SIGTERM and res.stderr.endswith(f"{MARKER}-exit {128 + signal.SIGTERM}\n")


def test_a_rank_placed_elsewhere_or_outside_srun_refuses_to_start():
    plan = plan_step("ring", HOSTS, env={}, token="t", starting_port=20000)
    res = run_task(plan.env, 2, "node1", ["true"])
    assert res.returncode == 125
    assert "rank 2 on node1: Slurm placed it on node1, the plan on node2" in res.stderr
    assert res.stderr.endswith(f"{MARKER}-exit 125\n")
    res = run_task(plan.env, 4, "node2", ["true"])
    assert res.returncode == 125 and "no planned node for this rank" in res.stderr
    env = {k: v for k, v in os.environ.items() if k != "SLURM_PROCID"}
    res = subprocess.run(wrapper_argv(["true"]), env={**env, **plan.env}, capture_output=True, text=True, timeout=30)
    assert res.returncode == 125 and "SLURM_PROCID is not set" in res.stderr


def test_nccl_devices_come_from_slurm_unless_it_bound_gpus():
    plan = plan_step("nccl", HOSTS, env={}, token="t", starting_port=20000, nccl_port=12345)
    assert plan.env["NCCL_HOST_IP"] == "10.9.0.11" and plan.env["MLX_WORLD_SIZE"] == "4"
    code = [sys.executable, "-c", SHOW, "CUDA_VISIBLE_DEVICES", "MLX_RANK"]
    got = json.loads(run_task(plan.env, 3, "node2", code, local_id=1).stdout)
    assert (got["CUDA_VISIBLE_DEVICES"], got["MLX_RANK"]) == ("1", "3")
    got = json.loads(run_task(plan.env, 3, "node2", code, local_id=1, SLURM_STEP_GPUS="5",
                              CUDA_VISIBLE_DEVICES="0").stdout)
    assert got["CUDA_VISIBLE_DEVICES"] == "0"   # Slurm's binding stays


def test_mpi_ranks_get_no_mlx_rank():
    plan = plan_step("mpi", HOSTS, env={}, token="t", starting_port=0, mpi_env={"MLX_MPI_LIBNAME": "libmpi.so.40"})
    got = json.loads(run_task(plan.env, 1, "node1", [sys.executable, "-c", SHOW, "MLX_RANK", "MLX_MPI_LIBNAME",
                                                     "MLX_JUPYTER_TOKEN"]).stdout)
    assert got == {"MLX_RANK": None, "MLX_MPI_LIBNAME": "libmpi.so.40", "MLX_JUPYTER_TOKEN": "t",
                   "hostfile": None, "path": None}


def test_no_secret_or_value_on_a_command_line():
    plan = plan_step("ring", HOSTS, env={"API_KEY": "hunter2"}, token="tok-123", starting_port=20000)
    argv = step_argv(12, NODES, 2, name="mlx-jupyter-x", stdin=False, kill_on_bad_exit=True, subset=False,
                     mpi=None, in_step=False) + wrapper_argv(["python", "t.py"])
    text = " ".join(argv)
    assert "hunter2" not in text and "tok-123" not in text and "10.9.0.11" not in text
    assert "--export=ALL" in argv and "--label" in argv and "--mpi=none" in argv
    assert plan.env["API_KEY"] == "hunter2" and plan.env["MLX_JUPYTER_TOKEN"] == "tok-123"


def test_command_lines():
    opts = SlurmOptions(nodes=4, ranks_per_node=2, partition="debug", time="10", account="lab",
                        args=["--gres=gpu:2 --constraint='a100&ib'"])
    argv = allocation_argv(opts, "mlx-jupyter-abc")
    assert argv[:2] == ["sbatch", "--parsable"] and "--nodes=4" in argv and "--ntasks-per-node=2" in argv
    assert {"--partition=debug", "--time=10", "--account=lab", "--gres=gpu:2", "--constraint=a100&ib",
            "--no-requeue", "--export=NONE"} <= set(argv)
    with pytest.raises(ValueError, match="--partition"):
        allocation_argv(SlurmOptions(partition="a b"), "x")
    with pytest.raises(ValueError, match="--slurm-arg"):
        allocation_argv(SlurmOptions(args=["--comment='unclosed"]), "x")
    argv = step_argv(3, NODES, 1, name="n", stdin=True, kill_on_bad_exit=False, subset=True, mpi="pmi2",
                     in_step=True, extra=["--mpi=pmix"])
    assert {"--input=all", "--kill-on-bad-exit=0", "--nodelist=node1,node2", "--overlap", "--mpi=pmix"} <= set(argv)
    assert "--mpi=none" not in argv and "--mpi=pmi2" not in argv
    assert "--mpi=pmix" in step_argv(3, NODES, 1, name="n", stdin=True, kill_on_bad_exit=False, subset=True,
                                     mpi="pmix", in_step=False)
    assert inside_allocation({"SLURM_JOB_ID": "42"}) == 42 and inside_allocation({}) is None
    assert in_step({"SLURM_STEP_ID": "0"}) and not in_step({"SLURM_STEP_ID": "4294967294"}) and not in_step({})


def test_too_many_ranks_for_a_derived_block():
    assert derived_port(7, CORE_PORT_OFFSET) == PORT_BASE
    with pytest.raises(ContractError, match="--starting-port"):
        derived_port(1, CORE_PORT_OFFSET + 1)


@given(st.integers(1, 10**9), st.integers(1, 400), st.integers(1, 2))
def test_derived_ports_stay_in_their_band(job, size, conns):
    start = derived_port(job, size, conns)
    assert PORT_BASE <= start and start + size * conns <= PORT_BASE + CORE_PORT_OFFSET
    nxt = derived_port(job + 1, size, conns)   # the next job's block does not overlap it (a band of one block aside)
    assert nxt >= start + size * conns or nxt + size * conns <= start or CORE_PORT_OFFSET // (size * conns) == 1
