"""A hostfile's backend and envs reach the ranks through every entry point (issue 14 §1).

Launcher, launch CLI, Cluster, %mlx_cluster and the panel's manager all read the hostfile with
``mlx_jupyter.hostfile`` and merge with ``merge_settings``. Real ranks where they can run here
(ring; mpi as root with Open MPI); jaccl ranks cannot, so their environment and plan are checked.
"""

from __future__ import annotations

import asyncio

import json
import os
import shutil

import pytest

from launch_helpers import PY, cli
from mlx_jupyter.hostfile import Hostfile, Host, merge_settings, parse_env
from mlx_jupyter.launch import Launcher
from mlx_jupyter.launch.launch_config import LaunchConfig
from mlx_jupyter.launch.job import Job

FAST = "MLX_METAL_FAST_SYNCH=1"
SHOW = "import os; print(os.environ.get('MLX_METAL_FAST_SYNCH'), os.environ.get('PROBE'), " \
       "os.environ.get('OMPI_COMM_WORLD_RANK') or os.environ.get('MLX_RANK'), bool(os.environ.get('MLX_HOSTFILE')))"
ROOT_OK = ["OMPI_ALLOW_RUN_AS_ROOT=1", "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1"]
needs_mpirun = pytest.mark.skipif(shutil.which("mpirun") is None, reason="needs Open MPI's mpirun")


def write(tmp_path, backend: str, envs: list[str], ips=("127.0.0.1", "127.0.0.1"), rdma=False) -> str:
    hosts = [{"ssh": ip if rdma else "127.0.0.1", "ips": [ip]} for ip in ips]  # jaccl: one rank per host
    if rdma:
        for i, h in enumerate(hosts):
            h["rdma"] = [None if i == j else f"rdma_en{j + 2}" for j in range(len(hosts))]
    path = tmp_path / f"{backend}.json"
    path.write_text(json.dumps({"backend": backend, "envs": envs, "hosts": hosts}))
    return str(path)


def jaccl_plan(path: str, backend=None, env=None) -> list:
    job = Job(LaunchConfig(command=[PY, "-c", "pass"], hosts=path, backend=backend, env=env or {}))
    return job._plans()


# -- the one rule ---------------------------------------------------------------------------------

def test_file_values_apply_and_explicit_ones_win_with_a_notice_naming_both():
    hf = Hostfile([Host("a", ["10.0.0.1"])], "jaccl", [FAST, "A=1"])
    s = merge_settings(hf, "hostfile h.json")
    assert (s.backend, s.env, s.notices) == ("jaccl", {"MLX_METAL_FAST_SYNCH": "1", "A": "1"}, [])
    s = merge_settings(hf, "hostfile h.json", "ring", {"A": "2", "B": "3"})
    assert s.backend == "ring" and s.env == {"MLX_METAL_FAST_SYNCH": "1", "A": "2", "B": "3"}
    assert s.notices == ["hostfile h.json says backend 'jaccl'; using 'ring' as given explicitly",
                         "hostfile h.json sets A=1; using A=2 as given explicitly"]
    assert merge_settings(hf, "h", "jaccl", {"A": "1"}).notices == []   # the same values: nothing to say
    assert merge_settings(None, "h").backend == "ring"


def test_bare_env_key_passes_the_launchers_value_on():
    env, warnings = parse_env(["TOKEN", "MISSING", "X=1"], passthrough={"TOKEN": "s3cret"})
    assert env == {"TOKEN": "s3cret", "X": "1"}
    assert warnings == ["--env MISSING: is not set here (a bare KEY passes this environment's value on); skipped"]


# -- Launcher ---------------------------------------------------------------------------------------

def test_launcher_jaccl_hostfile_plans_jaccl_with_its_envs(tmp_path):
    path = write(tmp_path, "jaccl", [FAST], ips=("127.0.0.1", "127.0.0.2"), rdma=True)
    plans = jaccl_plan(path)
    for p in plans:
        assert p.env["MLX_JACCL_COORDINATOR"] == "127.0.0.1:32323" and p.env["MLX_METAL_FAST_SYNCH"] == "1"
        assert "MLX_IBV_DEVICES" in p.files and "MLX_HOSTFILE" not in p.files


def test_launcher_explicit_backend_overrides_the_file_and_says_so(tmp_path, capfd):
    path = write(tmp_path, "jaccl", [FAST])
    plans = jaccl_plan(path, backend="ring", env={"PROBE": "x"})
    assert "MLX_HOSTFILE" in plans[0].files and plans[0].env["MLX_METAL_FAST_SYNCH"] == "1"
    err = capfd.readouterr().err
    assert f"hostfile {path} says backend 'jaccl'; using 'ring' as given explicitly" in err


@needs_mpirun
def test_launcher_runs_an_mpi_hostfiles_ranks_with_its_envs(tmp_path):
    path = write(tmp_path, "mpi", [FAST, "PROBE=file", *ROOT_OK])
    out: list = []
    launcher = Launcher([PY, "-c", SHOW], hosts=path, on_output=lambda r, s, line: out.append((s, line)))
    assert launcher.start().wait(timeout=90) == 0, out
    lines = sorted(line for s, line in out if s == "stdout")
    assert lines == ["1 file 0 False", "1 file 1 False"], out


def test_launcher_runs_a_ring_hostfiles_ranks_with_its_envs(tmp_path, port_block):
    path = write(tmp_path, "ring", [FAST, "PROBE=file"])
    out: list = []
    launcher = Launcher([PY, "-c", SHOW], hosts=path, starting_port=port_block(2),
                        on_output=lambda r, s, line: out.append((r, s, line)))
    assert launcher.start().wait(timeout=90) == 0, out
    assert sorted(line for _, s, line in out if s == "stdout") == ["1 file 0 True", "1 file 1 True"]


# -- launch CLI -------------------------------------------------------------------------------------

@needs_mpirun
def test_cli_runs_an_mpi_hostfile_with_its_envs(tmp_path):
    path = write(tmp_path, "mpi", [FAST, "PROBE=file", *ROOT_OK])
    res = cli(["--hostfile", path, "--output", "raw", "--", PY, "-c", SHOW], timeout=90)
    assert res.returncode == 0, res.stderr
    assert sorted(res.stdout.split("\n")[:-1]) == ["1 file 0 False", "1 file 1 False"], res.stdout


def test_cli_override_is_announced_and_used(tmp_path, port_block):
    path = write(tmp_path, "mpi", [FAST, "PROBE=file"])
    res = cli(["--hostfile", path, "--backend", "ring", "--env", "PROBE=flag", "-p", str(port_block(2)),
               "--output", "raw", "--", PY, "-c", SHOW], timeout=90)
    assert res.returncode == 0, res.stderr
    assert sorted(res.stdout.split("\n")[:-1]) == ["1 flag 0 True", "1 flag 1 True"]
    assert f"hostfile {path} says backend 'mpi'; using 'ring' as given explicitly" in res.stderr
    assert f"hostfile {path} sets PROBE=file; using PROBE=flag as given explicitly" in res.stderr


def test_cli_bare_env_key_reaches_the_ranks(tmp_path):
    res = cli(["-n", "1", "--env", "PROBE", "--", PY, "-c", SHOW], timeout=60, env={**os.environ, "PROBE": "passed"})
    assert res.returncode == 0, res.stderr
    assert res.stdout.split() == ["None", "passed", "0", "False"]


# -- Cluster, %mlx_cluster, the panel ---------------------------------------------------------------

def cluster_plans(cluster) -> list:
    """What the engine set's Launcher would plan for this cluster (see MLXEngineSetLauncher.start)."""
    es = cluster.processes.engine_config().MLXEngineSetLauncher
    return jaccl_plan(es.hostfile, backend=es.backend, env=dict(es.environment))


def test_cluster_keeps_the_hostfiles_backend_and_envs(tmp_path):
    from mlx_jupyter.cluster import Cluster

    path = write(tmp_path, "jaccl", [FAST], ips=("127.0.0.1", "127.0.0.2"), rdma=True)
    c = Cluster(n=1, hostfile=path, cell_channel=False)
    assert c.backend == "jaccl" and c.env == {"MLX_METAL_FAST_SYNCH": "1"}
    for p in cluster_plans(c):
        assert p.env["MLX_JACCL_COORDINATOR"] and p.env["MLX_METAL_FAST_SYNCH"] == "1"
        assert p.env["MLX_JUPYTER_BACKEND"] == "jaccl" if "MLX_JUPYTER_BACKEND" in p.env else True


def test_cluster_explicit_backend_wins_with_a_notice(tmp_path, capsys):
    from mlx_jupyter.cluster import Cluster

    path = write(tmp_path, "jaccl", [FAST])
    c = Cluster(n=1, hostfile=path, backend="ring", cell_channel=False)
    assert c.backend == "ring" and c.env["MLX_METAL_FAST_SYNCH"] == "1"
    assert "says backend 'jaccl'; using 'ring'" in capsys.readouterr().err


@pytest.mark.timeout(180)
def test_cluster_ranks_see_the_hostfiles_envs(tmp_path):
    from mlx_jupyter.cluster import Cluster

    path = write(tmp_path, "ring", [FAST, "PROBE=file"])
    with Cluster(n=1, hostfile=path, timeout=120) as c:
        view = c.client[:]
        view.execute("import os; got = ' '.join(os.environ.get(k, '-') for k in "
                     "('PROBE', 'MLX_METAL_FAST_SYNCH', 'MLX_JUPYTER_BACKEND'))", block=True)
        got = view.pull("got", block=True)
    assert got == ["file 1 ring", "file 1 ring"]


@pytest.mark.timeout(180)
def test_a_cluster_start_reads_its_hostfile_once(tmp_path, monkeypatch):
    """Cluster, its engine set and the launcher used to read the hostfile 3 to 5 times per start."""
    from mlx_jupyter import hostfile
    from mlx_jupyter.cluster import Cluster
    from mlx_jupyter.launch import job

    reads = []
    real = hostfile.read_hostfile

    def counted(path):
        reads.append(path)
        return real(path)

    monkeypatch.setattr(hostfile, "read_hostfile", counted)
    monkeypatch.setattr(job, "read_hostfile", counted)
    path = write(tmp_path, "ring", [FAST])
    with Cluster(n=1, hostfile=path, timeout=120) as c:
        assert c.size == 2 and c.local  # two 127.0.0.1 hosts: a local cluster (loopback, free ports)
        assert c.expected_size() == 2
    assert reads == [path]


def test_magic_passes_no_backend_so_the_hostfiles_applies(tmp_path, monkeypatch):
    from mlx_jupyter import magics
    from mlx_jupyter.cluster import cluster as handle

    made = []

    class Recorded(handle.Cluster):
        def start(self, progress=None, timeout=None):
            made.append(self)
            raise handle.ClusterError("stand-in: not started")

    monkeypatch.setattr(handle, "Cluster", Recorded)
    monkeypatch.setattr(magics, "_cluster", None)
    path = write(tmp_path, "jaccl", [FAST], ips=("127.0.0.1", "127.0.0.2"), rdma=True)
    with pytest.raises(magics.UsageError, match="stand-in"):
        magics.MLXMagics(shell=None).mlx_cluster(f"start --hostfile {path} --env PROBE=x")
    c = made[-1]
    assert c.backend == "jaccl" and c.env == {"MLX_METAL_FAST_SYNCH": "1", "PROBE": "x"}
    assert all(p.env["MLX_METAL_FAST_SYNCH"] == "1" and "MLX_JACCL_COORDINATOR" in p.env for p in cluster_plans(c))
    with pytest.raises(magics.UsageError, match=r"--env '1BAD=x': expected KEY=VALUE"):
        magics.MLXMagics(shell=None).mlx_cluster(f"start --hostfile {path} --env 1BAD=x")


def test_panel_manager_keeps_the_hostfiles_backend_and_envs(tmp_path):
    from mlx_jupyter.server.manager import ClusterManager

    path = write(tmp_path, "jaccl", [FAST], ips=("127.0.0.1", "127.0.0.2"), rdma=True)
    manager = ClusterManager(root_dir=str(tmp_path))
    try:
        c = asyncio.run(manager.create(n=1, hostfile=path)).cluster
        assert c.backend == "jaccl" and c.env == {"MLX_METAL_FAST_SYNCH": "1"}
        assert all("MLX_JACCL_COORDINATOR" in p.env for p in cluster_plans(c))
        assert asyncio.run(manager.create(n=1, hostfile=path, backend="ring")).cluster.backend == "ring"
    finally:
        manager._worker.shutdown(wait=False)
        manager.hostfiles.close()


# -- scripts, as MLX's launcher (issue 14 §5) -------------------------------------------------------

def test_any_local_file_runs_with_python_by_absolute_path(tmp_path, monkeypatch):
    from mlx_jupyter.launch.launch_config import rank_argv

    (tmp_path / "train").write_text("print('hi')\n")
    (tmp_path / "run.sh").write_text("#!/bin/sh\necho hi\n")
    (tmp_path / "run.sh").chmod(0o755)
    monkeypatch.chdir(tmp_path)
    assert rank_argv(["train", "--x"], "/py") == ["/py", str(tmp_path / "train"), "--x"]
    assert rank_argv(["./run.sh"], "/py") == ["./run.sh"]                     # executable: runs as itself
    assert rank_argv(["remote_only.py"], "/py") == ["/py", "remote_only.py"]  # not here: still python
    assert rank_argv(["echo", "hi"], "/py") == ["echo", "hi"]
    assert rank_argv([PY, "-c", "pass"], "/py") == [PY, "-c", "pass"]        # the interpreter itself


def test_cli_runs_a_script_without_py_suffix(tmp_path):
    (tmp_path / "job").write_text("import sys; print('ran', sys.executable == %r)\n" % PY)
    res = cli(["-n", "1", "--cwd", str(tmp_path), "--", "job"], timeout=60, cwd=str(tmp_path))
    assert res.returncode == 0, res.stderr
    assert res.stdout.strip() == "ran True"


def test_a_variable_the_launcher_sets_is_refused_not_dropped(tmp_path):
    """``--env MLX_RANK=3`` and a hostfile's ``MLX_JUPYTER_TOKEN=...`` were overwritten without a word: now
    the launch stops before any rank starts, naming where the variable was given."""
    marker = tmp_path / "started"
    code = f"open({str(marker)!r}, 'a').write('x')"
    res = cli(["-n", "2", "--env", "FOO=1", "--env", "MLX_RANK=3", PY, "-c", code])
    assert res.returncode == 2 and not marker.exists()
    assert "--env MLX_RANK: the launcher sets it for each rank (the launcher numbers the ranks 0 to n-1); drop it" \
        in res.stderr, res.stderr
    hostfile = tmp_path / "hf.json"
    hostfile.write_text(json.dumps({"envs": ["MLX_JUPYTER_TOKEN=abc"], "hosts": [{"ssh": "127.0.0.1"}]}))
    res = cli(["--hostfile", str(hostfile), PY, "-c", code])
    assert res.returncode == 2 and not marker.exists()
    assert f"hostfile {hostfile} envs MLX_JUPYTER_TOKEN: the launcher sets it for each rank" in res.stderr, res.stderr
