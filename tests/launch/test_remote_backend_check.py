"""A backend a remote host cannot run (nccl, jaccl) is refused before any rank starts, in one line naming the
host, the backend and `mlx-jupyter doctor` (issue 35 §5); the host is asked on the ssh session the launcher
opens anyway (its watchdog's), by its own Python."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from launch_helpers import PY, ROOT, cli
from mlx_jupyter.launch import LaunchError, remote_check

pytestmark = pytest.mark.timeout(180)


def test_only_a_checked_backend_and_a_python_command_ask_the_host():
    assert remote_check.probe_script("ring", ["python3", "x.py"], environ={}) == ""
    assert remote_check.probe_script("mpi", ["python3", "x.py"], environ={}) == ""
    assert remote_check.probe_script("nccl", ["./run.sh"], environ={}) == "", "not Python: nothing to ask with"
    assert remote_check.probe_script("nccl", ["python3", "x.py"], environ={"MLX_JUPYTER_CHECK_BACKEND": "0"}) == ""
    script = remote_check.probe_script("jaccl", ["/opt/py 3/bin/python3.12", "-u", "x.py"], environ={})
    assert script.startswith("( a=$('/opt/py 3/bin/python3.12' -c ") and script.rstrip().endswith(") &")


def test_the_refusal_is_one_line_naming_host_backend_and_doctor():
    line = remote_check.refusal("nccl", {"gpu-7": "no no NVIDIA driver (libcuda.so.1 not found)", "gpu-8": "yes"})
    assert line == ("the nccl backend cannot run on gpu-7 (no NVIDIA driver (libcuda.so.1 not found)): "
                    "run `mlx-jupyter doctor` there (MLX_JUPYTER_CHECK_BACKEND=0 starts the ranks anyway)")
    line = remote_check.refusal("nccl", {"a": "no no GPU", "b": "no this MLX build has no nccl", "c": "no no GPU"})
    assert line.startswith("the nccl backend cannot run on a, c (no GPU); nor on b (this MLX build has no nccl): ")
    assert remote_check.refusal("nccl", {"gpu-7": "yes"}) is None
    assert remote_check.refusal("nccl", {"gpu-7": "unknown"}) is None, "a host that cannot say is not refused"


def test_the_answer_is_read_after_other_lines_and_a_silent_host_is_unknown():
    async def answer(data: bytes, eof: bool, timeout: float = 5.0) -> str:
        reader = asyncio.StreamReader()
        reader.feed_data(data)
        if eof:
            reader.feed_eof()
        return await remote_check.read_answer(reader, timeout)

    marker = remote_check.MARKER.encode()
    assert asyncio.run(answer(b"banner\n" + marker + b" no this MLX build has no nccl\n", False)) == \
        "no this MLX build has no nccl"
    assert asyncio.run(answer(b"", True)) == "unknown"
    assert asyncio.run(answer(b"", False, timeout=0.2)) == "unknown"

    async def refuse() -> None:
        done: asyncio.Future = asyncio.get_running_loop().create_future()
        done.set_result("no no GPU")
        ok: asyncio.Future = asyncio.get_running_loop().create_future()
        ok.set_result("yes")
        await remote_check.refuse_unavailable({"h1": ok, "h2": done}, "nccl")

    with pytest.raises(LaunchError, match=r"^the nccl backend cannot run on h2 \(no GPU\): run `mlx-jupyter doctor`"):
        asyncio.run(refuse())


def test_nccl_on_hosts_without_a_gpu_is_refused_before_any_rank_starts(testbed, tmp_path: Path):
    hosts = testbed.ips[:2]
    marker = tmp_path / "started"
    code = f"open({str(marker)!r} + __import__('os').environ['MLX_RANK'], 'w')"
    res = cli([*testbed.cli_ssh_args(), "--backend", "nccl", "--hosts", ",".join(hosts),
               "--env", f"PYTHONPATH={ROOT}", PY, "-c", code], timeout=120)
    lines = res.stderr.strip().splitlines()
    assert res.returncode != 0 and len(lines) == 1, res.stderr
    assert f"the nccl backend cannot run on {hosts[0]}, {hosts[1]} (" in lines[0], lines[0]
    assert "`mlx-jupyter doctor`" in lines[0]
    assert not list(tmp_path.glob("started*")), "no rank started"
    res = cli([*testbed.cli_ssh_args(), "--backend", "nccl", "--hosts", ",".join(hosts),
               "--env", f"PYTHONPATH={ROOT}", PY, "-c", code], timeout=120, env={"MLX_JUPYTER_CHECK_BACKEND": "0"})
    assert sorted(p.name for p in tmp_path.glob("started*")) == ["started0", "started1"], res.stderr


def test_ring_on_hosts_asks_nothing_and_starts(testbed, tmp_path: Path):
    res = cli([*testbed.cli_ssh_args(), "--hosts", ",".join(testbed.ips[:2]), "--env", f"PYTHONPATH={ROOT}",
               PY, "-c", "print('up')"], timeout=120)
    assert res.returncode == 0 and res.stdout.count("up") == 2, res.stderr
