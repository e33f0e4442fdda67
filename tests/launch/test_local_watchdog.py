"""No local rank outlives its launcher: SIGKILL the CLI, a process using the Launcher API, a Jupyter kernel."""

from __future__ import annotations

import asyncio
import glob
import os
import shutil
import signal
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Optional

import psutil
import pytest

from launch_helpers import PY, LiveCLI, cli_env, pid_alive, wait_pids_gone, watcher_of, watchers_of
from mlx_jupyter.launch import Launcher
from mlx_jupyter.launch.local_watchdog import LOCAL_WATCHDOG_SCRIPT, LocalWatchdog
from mlx_jupyter.proc_identity import start_token

pytestmark = pytest.mark.timeout(120)

#: A rank with a child in its process group; prints both pids and its hostfile path.
#: the ready line in one write: an unbuffered print writes word by word, and the launcher streams a rank's
#: unfinished line, broken where another rank's output comes between
RANK = ("import os, subprocess, sys, time; c = subprocess.Popen(['sleep', '60']); "
        "sys.stdout.write(f\"ready {os.getpid()} {c.pid} {os.environ.get('MLX_HOSTFILE') or '-'}\\n\"); "
        "sys.stdout.flush(); time.sleep(60)")

#: The Launcher API in a process of its own (optionally with a forked child that outlives it).
API = """
import os, sys, time
from mlx_jupyter.launch import Launcher
# one write per line: print() writes the text and its newline apart, so two ranks' lines could interleave
Launcher(sys.argv[2:], repeat_hosts=2, on_output=lambda r, s, line: (sys.stdout.write(line + "\\n"), sys.stdout.flush())).start()
if sys.argv[1] == "fork":
    pid = os.fork()
    if pid == 0:
        time.sleep(60)
        os._exit(0)
    print("forked", pid, flush=True)
print("started", flush=True)
time.sleep(60)
"""

BOUND = 5.0   # seconds from the SIGKILL until ranks, watcher and temp dir are gone


def ready_pids(run: LiveCLI, n: int) -> tuple[list[int], list[str]]:
    """(rank and child pids, hostfile paths) once ``n`` ranks have printed ``ready``."""
    lines = [line.split() for line in run.wait_for(r"ready \d+ \d+", n)]
    return [int(w) for words in lines for w in words[-3:-1]], [words[-1] for words in lines]


def kill_leftovers(procs: list[psutil.Process]) -> None:
    """Clean up after a failure (psutil checks that a pid was not reused)."""
    for p in procs:
        try:
            p.kill()
        except psutil.Error:
            pass


def sigkill_and_check(run: LiveCLI, pids: list[int]) -> None:
    """SIGKILL the launcher; within BOUND every rank, its children and the watcher end and the temp dir goes."""
    watcher = watcher_of(run.proc.pid)
    tmpdir = Path(watcher.cmdline()[-1])
    assert tmpdir.is_dir()
    procs = [psutil.Process(p) for p in pids]
    t0 = time.monotonic()
    run.proc.kill()
    run.finish(10)
    try:
        left = wait_pids_gone([*pids, watcher.pid], BOUND - (time.monotonic() - t0))
        assert not left, f"still running {time.monotonic() - t0:.1f} s after the SIGKILL: {left}"
        assert not tmpdir.exists(), f"{tmpdir} left behind"   # the watcher removes it before it exits
    finally:
        kill_leftovers(procs)


def test_sigkilled_cli_leaves_no_rank_and_no_temp_dir():
    run = LiveCLI(["-n", "2", PY, "-c", RANK])
    pids, hostfiles = ready_pids(run, 2)
    assert {str(Path(h).parent) for h in hostfiles} == {watcher_of(run.proc.pid).cmdline()[-1]}
    sigkill_and_check(run, pids)


@pytest.mark.parametrize("mode", ["plain", "fork"])
def test_sigkilled_api_process_leaves_no_rank(mode):
    """The Launcher spawns from its loop thread; a forked child (that keeps running) holds no write end."""
    run = LiveCLI([], argv=[PY, "-c", API, mode, PY, "-c", RANK])
    pids, _ = ready_pids(run, 2)
    run.wait_for("^started$")
    forked = [psutil.Process(int(x.split()[1])) for x in run.wait_for("^forked")] if mode == "fork" else []
    try:
        sigkill_and_check(run, pids)
        assert all(pid_alive(p.pid) for p in forked)   # the guard fired although it lives
    finally:
        kill_leftovers(forked)


def test_sigkilled_cli_leaves_no_mpi_rank(mpirun):
    """mpirun gives each rank a process group of its own: the watcher kills mpirun's whole session."""
    run = LiveCLI(["--backend", "mpi", "-n", "2", "--env", "OMPI_ALLOW_RUN_AS_ROOT=1",
                   "--env", "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1", PY, "-c", RANK])
    pids, _ = ready_pids(run, 2)
    assert len({os.getpgid(p) for p in pids}) == 2
    mpirun_pid = os.getsid(pids[0])
    assert glob.glob(f"{tempfile.gettempdir()}/ompi.*/pid.{mpirun_pid}"), "Open MPI's session dir not found"
    sigkill_and_check(run, pids)
    # a SIGKILLed mpirun cannot remove its session dir: the watcher does
    assert not glob.glob(f"{tempfile.gettempdir()}/ompi.*/pid.{mpirun_pid}")


def test_watcher_ends_with_the_launch():
    before = watchers_of(os.getpid())
    launcher = Launcher([PY, "-c", "import time; time.sleep(1)"], repeat_hosts=2, on_output=lambda *a: None).start()
    (watcher,) = watchers_of(os.getpid()) - before
    tmpdir = Path(watcher.cmdline()[-1])
    assert launcher.wait(30) == 0
    assert not wait_pids_gone([watcher.pid], 2.0) and not tmpdir.exists()


def test_stop_ends_the_watcher():
    before = watchers_of(os.getpid())
    launcher = Launcher([PY, "-c", "import time; time.sleep(60)"], repeat_hosts=2, on_output=lambda *a: None).start()
    (watcher,) = watchers_of(os.getpid()) - before
    launcher.stop()
    assert not wait_pids_gone([watcher.pid, *(r.pid for r in launcher.ranks)], 2.0)


def test_watcher_kills_registered_groups_with_a_hostile_temp_dir(tmp_path, monkeypatch):
    """The temp dir's path reaches the watcher as an argument, never as shell text."""
    hostile = tmp_path / "a b'$(touch pwned)`touch pwned2`;\"x\ny"
    hostile.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(hostile))

    async def scenario() -> tuple[int, str]:
        guard = await LocalWatchdog.start()
        assert guard.path.startswith(str(hostile))
        proc = await asyncio.create_subprocess_exec("sleep", "60", start_new_session=True)
        try:
            guard.register(proc.pid)
            await guard.close()
            await asyncio.wait_for(proc.wait(), 5)
        finally:
            if proc.returncode is None:
                proc.kill()
                await proc.wait()
        return proc.returncode, guard.path

    code, path = asyncio.run(scenario())
    assert code == -signal.SIGKILL
    assert not Path(path).exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == [hostile.name]
    assert list(hostile.iterdir()) == []


def test_sigkilled_jupyter_kernel_leaves_no_rank(tmp_path):
    """The Jupyter cluster starts its ranks with the Launcher inside the kernel."""
    jupyter_client = pytest.importorskip("jupyter_client.manager")
    km, kc = jupyter_client.start_new_kernel(kernel_name="python3", cwd=str(tmp_path), env=cli_env())
    ranks: list[psutil.Process] = []
    controller: list[psutil.Process] = []
    try:
        out: list[str] = []

        def hook(msg):   # whatever the start shows (text, a widget's text/plain, an error)
            content = msg["content"]
            out.append(content.get("text") or content.get("data", {}).get("text/plain") or content.get("evalue") or "")
        reply = kc.execute_interactive("import os; print('kernel', os.getpid())\n%load_ext mlx_jupyter\n"
                                       "%mlx_cluster start -n 2", timeout=90, output_hook=hook)
        text = "\n".join(out)
        assert reply["content"]["status"] == "ok", text
        kernel = int(text.split("kernel ", 1)[1].split()[0])
        descendants = psutil.Process(kernel).children(recursive=True)
        ranks = [p for p in descendants if "MLX_RANK" in _environ(p)]
        controller = [p for p in descendants if p not in ranks]
        assert len(ranks) == 2, [p.cmdline() for p in descendants]
        t0 = time.monotonic()
        os.kill(kernel, signal.SIGKILL)
        left = wait_pids_gone([p.pid for p in ranks], BOUND)
        assert not left, f"ranks still running {time.monotonic() - t0:.1f} s after the kernel's SIGKILL"
    finally:
        kill_leftovers(ranks)
        kc.stop_channels()
        km.shutdown_kernel(now=True)
        kill_leftovers(controller)   # ipyparallel's controller (and the watcher): not the launcher's ranks


def _environ(p: psutil.Process) -> dict:
    try:
        return p.environ()
    except (psutil.NoSuchProcess, psutil.AccessDenied):
        return {}


@pytest.fixture
def mpirun():
    if shutil.which("mpirun") is None:
        if os.environ.get("CI") == "true":
            pytest.fail("mpirun is missing under CI: .ci/run installs openmpi-bin")
        pytest.skip("mpirun not installed (apt-get install openmpi-bin)")


#: A session leader with a child in a process group of its own (as mpirun starts its ranks).
SESSION = ("import subprocess, time; c = subprocess.Popen(['sleep', '60'], process_group=0); "
           "print(c.pid, flush=True); time.sleep(60)")


@pytest.mark.parametrize("kill_by", ["pkill", "proc"])
def test_watcher_kills_the_rest_of_a_registered_session(tmp_path, kill_by):
    """With pkill, or (Linux without procps) by reading /proc."""
    if kill_by == "pkill" and shutil.which("pkill") is None:
        pytest.skip("no pkill here")
    if kill_by == "proc" and not os.path.exists("/proc/self/stat"):
        pytest.skip("no /proc here")
    bindir = tmp_path / "bin"   # the watcher's only PATH: rm, and pkill if wanted
    bindir.mkdir()
    for tool in ["rm", "pkill"] if kill_by == "pkill" else ["rm"]:
        (bindir / tool).symlink_to(shutil.which(tool))
    guarded = tmp_path / "guarded"
    (guarded / "pids").mkdir(parents=True)
    leader = subprocess.Popen([PY, "-c", SESSION], stdout=subprocess.PIPE, text=True, start_new_session=True)
    procs = [psutil.Process(leader.pid)]
    try:
        procs.append(psutil.Process(int(leader.stdout.readline())))
        assert os.getpgid(procs[1].pid) != leader.pid and os.getsid(procs[1].pid) == leader.pid
        (guarded / "pids" / str(leader.pid)).write_text(f"{leader.pid} {start_token(leader.pid)}\n")
        session_dir = tmp_path / "base" / "ompi.node.0" / f"pid.{leader.pid}"   # as a killed mpirun leaves it
        (session_dir / "pmix").mkdir(parents=True)
        watcher = subprocess.Popen(["/bin/sh", "-c", LOCAL_WATCHDOG_SCRIPT, "w", str(tmp_path / "base"), str(guarded)],
                                   stdin=subprocess.PIPE,
                                   env={"PATH": str(bindir)}, stderr=subprocess.PIPE)
        watcher.stdin.close()   # the launcher is gone
        assert watcher.wait(10) == 0 and watcher.stderr.read() == b""
        assert leader.wait(5) == -signal.SIGKILL
        assert not wait_pids_gone([procs[1].pid], 5.0)
        assert not guarded.exists()
        assert not session_dir.parent.exists()   # the session dir, then its emptied parent
    finally:
        kill_leftovers(procs)
        leader.stdout.close()


#: A process of the test's own in a session of its own, as a rank is: what a reused pid would name.
STRANGER = "import sys; print('up', flush=True); sys.stdin.read()"


@pytest.mark.parametrize("recorded", ["another start", "no start"])
def test_a_pid_file_naming_a_process_by_another_start_leaves_it_alive(tmp_path, recorded):
    """A recycled pid: the pid file names a live process (the test's, leading its own group and
    session, as a reused pid's new owner may) but with another start time, or none; the watcher,
    fired, must leave it and its group alone (issue 44 §4: it killed by pid file alone)."""
    guarded = tmp_path / "guarded"
    (guarded / "pids").mkdir(parents=True)
    stranger = subprocess.Popen([PY, "-c", STRANGER], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
                                start_new_session=True)
    try:
        assert stranger.stdout.readline() == "up\n"
        token = start_token(stranger.pid)
        assert token
        other = str(int(token) - 1) if token.isdigit() else token.replace(":", ";")
        (guarded / "pids" / str(stranger.pid)).write_text(
            f"{stranger.pid} {other}\n{stranger.pid} {other}\n" if recorded == "another start" else "")
        watcher = subprocess.Popen(["/bin/sh", "-c", LOCAL_WATCHDOG_SCRIPT, "w", str(tmp_path / "base"), str(guarded)],
                                   stdin=subprocess.PIPE, stderr=subprocess.PIPE)
        watcher.stdin.close()   # the launcher is gone: the watcher does its cleanup
        assert watcher.wait(10) == 0 and watcher.stderr.read() == b""
        assert not guarded.exists()
        assert stranger.poll() is None, "the watcher killed a process it did not start"
        stranger.stdin.close()
        assert stranger.wait(10) == 0
    finally:
        if stranger.poll() is None:
            stranger.kill()
            stranger.wait()


def test_a_member_recorded_alone_is_killed_after_its_leader_is_gone_and_only_while_it_is_itself(tmp_path):
    """The controller's case: its leader dead (SIGKILL), a forked child left in its group; the
    child, recorded with its start, is killed; a member whose start does not match is left."""
    async def scenario() -> tuple[int, Optional[int]]:
        guard = await LocalWatchdog.start()
        leader = await asyncio.create_subprocess_exec("sleep", "60", start_new_session=True)
        member = await asyncio.create_subprocess_exec("sleep", "60", start_new_session=True)
        stranger = await asyncio.create_subprocess_exec("sleep", "60", start_new_session=True)
        try:
            guard.register(leader.pid)
            guard.add_members(leader.pid, [member.pid])
            with open(os.path.join(guard.path, "pids", str(leader.pid)), "a") as f:
                f.write(f"{stranger.pid} 1\n")   # a start it never had: a pid reused since
            leader.kill()
            await leader.wait()   # reaped: its pid may be anyone's now
            await guard.close()
            await asyncio.wait_for(member.wait(), 5)
            return member.returncode, stranger.returncode
        finally:
            for p in (leader, member, stranger):
                if p.returncode is None:
                    p.kill()
                    await p.wait()

    member_code, stranger_code = asyncio.run(scenario())
    assert member_code == -signal.SIGKILL and stranger_code is None
