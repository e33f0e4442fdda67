"""The launcher across 4 ssh hosts (network namespaces with a real sshd each)."""

from __future__ import annotations

import json
import os
import secrets
import signal
import textwrap
import threading
import time
from pathlib import Path

import pytest

from launch_helpers import collector, PY, ROOT, LiveCLI, cli, cpu_seconds
from needs import require_core
from mlx_jupyter.hostfile import Host
from mlx_jupyter.launch import LaunchError, Launcher

pytestmark = pytest.mark.timeout(120)

#: Seconds after a cut host is plugged back in within which its orphaned ranks must be gone:
#: its sshd learns of the dead connection from the launcher's retransmitted FIN, whose backoff
#: interval is at most about the length of the cut (~6 s here); measured 0.2 s.
HEAL_BOUND = 15.0


def hosts_of(bed, n: int | None = None) -> list[Host]:
    return [Host(ip, [ip]) for ip in bed.ips[: n or bed.n]]


def stdout_of(out) -> dict[int, list[str]]:
    res: dict[int, list[str]] = {}
    for rank, stream, line in out:
        if stream == "stdout":
            res.setdefault(rank, []).append(line)
    return res


def remote_tmp() -> set[Path]:
    """Rank temp dirs (the hosts share this machine's /tmp)."""
    return set(Path("/tmp").glob("mlx-jupyter.*"))


def wait_until(pred, timeout: float) -> bool:
    """Poll ``pred`` until true or timeout (for state outside our process, e.g. other namespaces)."""
    deadline = time.monotonic() + timeout
    event = threading.Event()
    while not pred():
        if time.monotonic() > deadline:
            return False
        event.wait(0.05)
    return True


def bed_pids(bed) -> set[tuple[int, int]]:
    """(host, pid) of every process on the hosts but their sshd listeners."""
    keep = {p.pid for p in bed._sshd.values()}
    return {(i, pid) for i in range(1, bed.n + 1) for pid in bed.ns_pids(i) if pid not in keep}


@pytest.fixture(autouse=True)
def no_leftovers(testbed):
    """Every test leaves no process (rank, wrapper, watchdog, sshd session) and no temp dir behind on any host."""
    before, procs = remote_tmp(), bed_pids(testbed)
    yield
    assert wait_until(lambda: remote_tmp() <= before, 5), f"temp dirs left: {remote_tmp() - before}"
    assert wait_until(lambda: bed_pids(testbed) <= procs, 5), f"processes left: {_describe(bed_pids(testbed) - procs)}"


def _describe(procs) -> list[str]:
    out = []
    for i, pid in sorted(procs):
        try:
            out.append(f"h{i}:{pid}:" + Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()[:120])
        except OSError:
            pass
    return out


def test_env_and_files_reach_every_host(testbed):
    out, on_output = collector()
    code = ("import os, json, socket; p = os.environ.get('MLX_HOSTFILE'); "
            "print(json.dumps([socket.gethostname(), os.environ['MLX_RANK'], os.environ['TB_HOST_IP'], "
            "json.load(open(p)), os.environ['MLX_JUPYTER_TOKEN'], os.getcwd()]))")
    launcher = Launcher([PY, "-c", code], hosts=hosts_of(testbed), ssh_options=testbed.ssh_options(),
                        on_output=on_output, cwd=str(ROOT)).start()
    assert launcher.wait(60) == 0, out
    rows = {r: json.loads(lines[0]) for r, lines in stdout_of(out).items()}
    plan = [[f"{ip}:{32323 + i}"] for i, ip in enumerate(testbed.ips)]
    for r in range(4):
        name, rank, ip, hostfile, token, cwd = rows[r]
        assert (name, rank, ip, hostfile, cwd) == (f"h{r + 1}", str(r), testbed.ips[r], plan, str(ROOT))
        assert token == launcher.token
    assert all(i.pid and i.state == "exited" for i in launcher.ranks)


def test_real_mlx_ring_all_sum_on_four_hosts(testbed):
    out, on_output = collector()
    code = ("import mlx.core as mx; g = mx.distributed.init(backend='ring', strict=True); "
            "x = mx.distributed.all_sum(mx.arange(4) + g.rank()); print(g.rank(), g.size(), x.tolist())")
    launcher = Launcher([PY, "-c", code], hosts=hosts_of(testbed), ssh_options=testbed.ssh_options(),
                        on_output=on_output).start()
    assert launcher.wait(90) == 0, out
    lines = stdout_of(out)
    assert {r: lines[r][-1] for r in lines} == {r: f"{r} 4 [6, 10, 14, 18]" for r in range(4)}


def test_our_core_all_sum_on_four_hosts(testbed, env_pythonpath):
    require_core()
    out, on_output = collector()
    code = ("import numpy as np; from mlx_jupyter import distributed as d; g = d.init(backend='ring', strict=True); "
            "x = d.all_sum(np.arange(4, dtype=np.int64) + g.rank()); print(g.rank(), g.size(), list(map(int, x)))")
    launcher = Launcher([PY, "-c", code], hosts=hosts_of(testbed), ssh_options=testbed.ssh_options(),
                        on_output=on_output, env=env_pythonpath).start()
    assert launcher.wait(90) == 0, out
    lines = stdout_of(out)
    assert {r: lines[r][-1] for r in lines} == {r: f"{r} 4 [6, 10, 14, 18]" for r in range(4)}


def test_cli_one_rank_over_ssh_with_our_core(testbed):
    require_core()
    code = ("import numpy as np, socket; from mlx_jupyter import distributed as d; g = d.init(backend='ring', strict=True); "
            "print(socket.gethostname(), g.rank(), g.size(), list(map(int, d.all_sum(np.arange(3) + 1))))")
    res = cli([*testbed.cli_ssh_args(), "--hosts", testbed.ips[1], "--env", f"PYTHONPATH={ROOT}", PY, "-c", code])
    assert res.returncode == 0, res.stderr
    assert res.stdout == "h2 0 1 [1, 2, 3]\n"


def test_rank_failure_clears_every_host_within_2s(testbed):
    marker = "mlxj-" + secrets.token_hex(4)
    code = f"import os, sys, time; r = int(os.environ['MLX_RANK']); print('ready', flush=True); sys.stdin.readline(); sys.exit(1) if r == 1 else time.sleep(60)  # {marker}"
    ready = threading.Semaphore(0)
    failed_at = {}
    launcher = Launcher([PY, "-c", code], hosts=hosts_of(testbed), ssh_options=testbed.ssh_options(), stdin=True,
                        on_output=lambda r, s, line: line == "ready" and ready.release(),
                        on_exit=lambda r, c: failed_at.setdefault(r, time.monotonic())).start()
    for _ in range(4):
        assert ready.acquire(timeout=30)
    assert set(testbed.procs_matching(marker)) == {1, 2, 3, 4}
    launcher.write_stdin(b"go\n")
    assert launcher.wait(30) == 1
    assert wait_until(lambda: not testbed.procs_matching(marker), 2.0 - (time.monotonic() - failed_at[1]))
    assert time.monotonic() - failed_at[1] < 2.0
    assert [i.state for i in launcher.ranks] == ["killed", "exited", "killed", "killed"]
    assert f"rank 1 on {testbed.ips[1]} exited with code 1" in launcher.summary()


def test_host_cut_mid_run_is_reported_and_the_rest_cleaned(healthy):
    bed = healthy
    marker = "mlxj-" + secrets.token_hex(4)
    code = f"import time; print('ready', flush=True); time.sleep(60)  # {marker}"
    ready = threading.Semaphore(0)
    launcher = Launcher([PY, "-c", code], hosts=hosts_of(bed), ssh_options=bed.ssh_options(),
                        on_output=lambda r, s, line: line == "ready" and ready.release()).start()
    try:
        for _ in range(4):
            assert ready.acquire(timeout=30)
        bed.cut(3)
        t0 = time.monotonic()
        code = launcher.wait(timeout=bed.ssh_options().dead_after() + 5)
        elapsed = time.monotonic() - t0
        assert code == 255
        assert elapsed < bed.ssh_options().dead_after() + 3
        summary = launcher.summary()
        assert f"rank 2 on {bed.ips[2]} lost" in summary and "keepalive" in summary, summary
        assert launcher.ranks[2].state == "lost"
        assert wait_until(lambda: set(bed.procs_matching(marker)) <= {3}, 2.0)
    finally:
        launcher.stop()
        bed.heal(3)
    # the cut host's rank could not be told: once packets flow again, its sshd sees the dead
    # connection and the watchdog kills the rank and removes its temp dir
    healed = time.monotonic()
    assert wait_until(lambda: not bed.procs_matching(marker), HEAL_BOUND), bed.procs_matching(marker)
    # (no_leftovers then checks that its wrapper, watchdog and temp dirs are gone too)


def _ready_lines(n: int):
    """A semaphore released per "ready" line, and the on_output callback that releases it."""
    ready = threading.Semaphore(0)
    return ready, (lambda r, s, line: line.startswith("ready") and ready.release())


CHILD = "import subprocess, sys; subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)  # {m}'])"


def test_cli_sigkill_leaves_nothing_on_the_hosts(testbed):
    """The launcher SIGKILLed mid-run: the watchdogs kill every rank (and its children) and remove the temp dirs."""
    marker = "mlxj-" + secrets.token_hex(4)
    code = f"{CHILD.format(m=marker)}; import time; print('ready', flush=True); time.sleep(60)  # {marker}"
    before = remote_tmp()
    run = LiveCLI([*testbed.cli_ssh_args(), "--hosts", ",".join(testbed.ips), PY, "-c", code])
    run.wait_for("ready", 4)
    assert wait_until(lambda: all(len(p) == 2 for p in testbed.procs_matching(marker, exe=PY).values())
                      and len(testbed.procs_matching(marker, exe=PY)) == 4, 10), testbed.procs_matching(marker)
    assert len(remote_tmp() - before) == 8   # a rank dir per rank, a watchdog dir per host
    run.proc.kill()
    killed = time.monotonic()
    run.finish(10)
    assert wait_until(lambda: not testbed.procs_matching(marker), 5.0), testbed.procs_matching(marker)
    assert wait_until(lambda: remote_tmp() <= before, 5.0 - (time.monotonic() - killed)), remote_tmp() - before


def test_failure_kills_whole_remote_process_groups_even_if_sigterm_is_ignored(testbed):
    """A rank fails: the others (ignoring SIGTERM, with a child each) are all gone within 2 s, KILL included."""
    marker = "mlxj-" + secrets.token_hex(4)
    code = (f"{CHILD.format(m=marker)}; import os, signal, sys, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); "
            f"print('ready', flush=True); sys.stdin.readline(); r = int(os.environ['MLX_RANK']); "
            f"sys.exit(1) if r == 3 else time.sleep(60)  # {marker}")
    ready, on_output = _ready_lines(4)
    failed_at = {}
    launcher = Launcher([PY, "-c", code], hosts=hosts_of(testbed), ssh_options=testbed.ssh_options(), stdin=True,
                        on_output=on_output, on_exit=lambda r, c: failed_at.setdefault(r, time.monotonic())).start()
    for _ in range(4):
        assert ready.acquire(timeout=30)
    assert wait_until(lambda: sum(len(p) for p in testbed.procs_matching(marker, exe=PY).values()) == 8, 10)
    launcher.write_stdin(b"go\n")
    assert launcher.wait(30) == 1
    assert wait_until(lambda: not testbed.procs_matching(marker), 2.0 - (time.monotonic() - failed_at[3])), \
        testbed.procs_matching(marker)
    assert [i.state for i in launcher.ranks] == ["killed", "killed", "killed", "exited"]
    assert all(launcher.ranks[r].returncode == 128 + signal.SIGKILL for r in range(3)), launcher.ranks


def test_cli_second_ctrl_c_terminates_remote_ranks(testbed):
    marker = "mlxj-" + secrets.token_hex(4)
    code = f"import signal, time; signal.signal(signal.SIGINT, signal.SIG_IGN); print('ready', flush=True); time.sleep(60)  # {marker}"
    run = LiveCLI([*testbed.cli_ssh_args(), "--hosts", ",".join(testbed.ips[:2]), PY, "-c", code])
    run.wait_for("ready", 2)
    run.proc.send_signal(signal.SIGINT)
    run.wait_for("forwarding Ctrl-C")
    run.proc.send_signal(signal.SIGINT)
    second = time.monotonic()
    assert run.finish(10) == 128 + signal.SIGTERM, run.text
    assert "terminated: rank 0 on" in run.text and "rank 1 on" in run.text
    assert wait_until(lambda: not testbed.procs_matching(marker), 2.0 - (time.monotonic() - second))


def test_hostile_env_args_and_cwd_arrive_literally(testbed, tmp_path):
    hostile = "a'b\"c $(touch /tmp/pwned) `id`; x\ny \\ $HOME *"
    cwd = tmp_path / "dir 'q' $(x) `y`;"
    cwd.mkdir()
    out, on_output = collector()
    code = "import os, sys, json; print(json.dumps([os.environ['HOSTILE'], sys.argv[1:], os.getcwd()]))"
    launcher = Launcher([PY, "-c", code, hostile, "--opt", ""], hosts=hosts_of(testbed, 2),
                        ssh_options=testbed.ssh_options(), env={"HOSTILE": hostile}, cwd=str(cwd),
                        on_output=on_output).start()
    assert launcher.wait(60) == 0, out
    for r, lines in stdout_of(out).items():
        assert json.loads("\n".join(lines)) == [hostile, [hostile, "--opt", ""], str(cwd)]
    assert not Path("/tmp/pwned").exists()


def test_hostile_host_names_and_bad_env_names_are_refused(testbed):
    for name in ["h1;reboot", "$(id)", "-oProxyCommand=touch /tmp/pwned", "a b"]:
        res = cli(["--hosts", name, "true"])
        assert res.returncode == 2 and "not a valid host name" in res.stderr and "Traceback" not in res.stderr
    with pytest.raises(LaunchError, match="environment variable name"):
        Launcher(["true"], hosts=hosts_of(testbed, 1), ssh_options=testbed.ssh_options(),
                 env={"BAD;NAME": "1"}).start()
    assert not Path("/tmp/pwned").exists()


def test_missing_cwd_on_host_is_a_clear_error(testbed):
    with pytest.raises(LaunchError, match=rf"rank 0 on {testbed.ips[0]}: cannot change directory to /no/such"):
        Launcher(["true"], hosts=hosts_of(testbed, 1), ssh_options=testbed.ssh_options(), cwd="/no/such").start()


def test_ssh_config_alias_user_identity_and_proxyjump(testbed, tmp_path):
    cfg = tmp_path / "ssh_config"
    cfg.write_text(textwrap.dedent(f"""
        Host node-a
            HostName {testbed.ips[0]}
            User root
            Port 22
            IdentityFile {testbed.key}
        Host node-b
            HostName {testbed.ips[1]}
            User root
            IdentityFile {testbed.key}
            ProxyJump node-a
        Host *
            UserKnownHostsFile {testbed.known_hosts}
    """))
    opts = testbed.ssh_options(config=[str(cfg)], known_hosts=None, client_keys=None, username=None)
    out, on_output = collector()
    # nccl needs rank 0's IP: a name gets its HostName from the ssh config, as ssh would
    launcher = Launcher(["sh", "-c", "echo $NCCL_HOST_IP"], hosts="node-a,node-b", backend="nccl",
                        ssh_options=opts, on_output=on_output).start()
    assert launcher.wait(30) == 0
    assert stdout_of(out) == {0: [testbed.ips[0]], 1: [testbed.ips[0]]}
    out.clear()
    hosts = [Host("node-a", [testbed.ips[0]]), Host("node-b", [testbed.ips[1]])]
    launcher = Launcher(["hostname"], hosts=hosts, ssh_options=opts, on_output=on_output).start()
    assert launcher.wait(30) == 0
    assert stdout_of(out) == {0: ["h1"], 1: ["h2"]}


def _other_key_file(bed, path: Path) -> Path:
    """A known_hosts file recording h2's key for h1's address: h1's key looks *changed*."""
    other_key = Path(bed.root / "h2" / "ssh_host_ed25519_key.pub").read_text().split()
    path.write_text(f"{bed.ips[0]} {other_key[0]} {other_key[1]}\n")
    return path


def _key_config(bed, path: Path, user_known_hosts: str) -> Path:
    """An ssh config whose UserKnownHostsFile is ``user_known_hosts`` (no global files)."""
    path.write_text(f"Host *\n    User root\n    IdentityFile {bed.key}\n"
                    f"    UserKnownHostsFile {user_known_hosts}\n    GlobalKnownHostsFile /dev/null\n")
    return path


@pytest.mark.parametrize("via", ["option", "config"])
def test_host_keys_are_verified(testbed, tmp_path, capfd, via):
    """Unknown keys refused unless accepted (with a warning); a changed key refused always, naming file and fix."""
    hosts = hosts_of(testbed, 1)
    ip = testbed.ips[0]

    def opts(known: Path, **kw):
        if via == "option":
            return testbed.ssh_options(known_hosts=str(known), **kw)
        cfg = _key_config(testbed, tmp_path / f"config-{known.name}", str(known))
        return testbed.ssh_options(config=[str(cfg)], known_hosts=None, **kw)

    empty = tmp_path / "known_hosts"
    empty.write_text("")
    with pytest.raises(LaunchError, match=f"ssh to {ip}: host key not verifiable against {empty}.*--accept-unknown-hosts"):
        Launcher(["true"], hosts=hosts, ssh_options=opts(empty)).start()
    capfd.readouterr()
    launcher = Launcher(["true"], hosts=hosts, ssh_options=opts(empty, accept_unknown_hosts=True)).start()
    assert launcher.wait(30) == 0
    assert f"warning: accepting the unknown host key of {ip}" in capfd.readouterr().err
    # the right key, found only through the config / the option: accepted without a warning
    launcher = Launcher(["true"], hosts=hosts, ssh_options=opts(testbed.known_hosts)).start()
    assert launcher.wait(30) == 0
    # a *changed* key is refused even when unknown hosts are accepted
    wrong = _other_key_file(testbed, tmp_path / "wrong_known_hosts")
    for accept in (False, True):
        with pytest.raises(LaunchError) as err:
            Launcher(["true"], hosts=hosts, ssh_options=opts(wrong, accept_unknown_hosts=accept)).start()
        msg = str(err.value)
        assert f"ssh to {ip}: the host key of {ip} has CHANGED" in msg and str(wrong) in msg, msg
        assert f"ssh-keygen -R {ip} -f {wrong}" in msg and "Traceback" not in msg
    assert "accepting" not in capfd.readouterr().err


def test_known_hosts_none_in_config_verifies_nothing_away(testbed, tmp_path):
    """``UserKnownHostsFile none`` leaves no file to trust: refused (asyncssh alone would skip the check)."""
    cfg = _key_config(testbed, tmp_path / "config", "none")
    with pytest.raises(LaunchError, match="host key not verifiable against no known_hosts file"):
        Launcher(["true"], hosts=hosts_of(testbed, 1),
                 ssh_options=testbed.ssh_options(config=[str(cfg)], known_hosts=None)).start()


def test_proxyjump_hop_key_is_verified_too(testbed, tmp_path):
    """A ProxyJump hop whose recorded key changed is refused, whatever the destination's key."""
    wrong = _other_key_file(testbed, tmp_path / "wrong_known_hosts")
    cfg = tmp_path / "config"
    cfg.write_text(textwrap.dedent(f"""
        Host jump
            HostName {testbed.ips[0]}
            UserKnownHostsFile {wrong}
        Host {testbed.ips[1]}
            ProxyJump jump
            UserKnownHostsFile {testbed.known_hosts}
        Host *
            User root
            IdentityFile {testbed.key}
            GlobalKnownHostsFile /dev/null
    """))
    opts = testbed.ssh_options(config=[str(cfg)], known_hosts=None, accept_unknown_hosts=True)
    with pytest.raises(LaunchError, match=f"ssh to {testbed.ips[1]}: via ProxyJump jump: .*has CHANGED"):
        Launcher(["true"], hosts=[Host(testbed.ips[1], [testbed.ips[1]])], ssh_options=opts).start()


def test_unreachable_host_fails_fast_with_its_name(testbed):
    opts = testbed.ssh_options(connect_timeout=2)
    missing = f"{testbed.net}.99"  # in the subnet, no such host: guarded, never routed off the machine
    t0 = time.monotonic()
    with pytest.raises(LaunchError, match=f"ssh to {missing}"):
        Launcher(["true"], hosts=[Host(missing, [missing]), *hosts_of(testbed, 1)], ssh_options=opts).start()
    assert time.monotonic() - t0 < 10


@pytest.mark.parametrize("backend", ["jaccl", "jaccl-ring", "nccl"])
def test_jaccl_and_nccl_contract_on_hosts(testbed, backend, monkeypatch):
    monkeypatch.setenv("MLX_JUPYTER_CHECK_BACKEND", "0")   # the hosts cannot run it: the contract is what is tested
    n = 4
    hosts = [Host(ip, [ip], [None if j == i else f"rdma_en{i}{j}" for j in range(n)]) for i, ip in enumerate(testbed.ips)]
    code = ("import os, json; f = os.environ.get('MLX_IBV_DEVICES'); print(json.dumps({k: v for k, v in os.environ.items() "
            "if k.startswith(('MLX_', 'NCCL_', 'CUDA_'))} | {'devices': json.load(open(f)) if f else None}))")
    out, on_output = collector()
    launcher = Launcher([PY, "-c", code], hosts=hosts, backend=backend, starting_port=4242, ssh_options=testbed.ssh_options(),
                        on_output=on_output).start()
    assert launcher.wait(60) == 0, out
    envs = {r: json.loads(lines[0]) for r, lines in stdout_of(out).items()}
    for r, env in envs.items():
        assert env["MLX_RANK"] == str(r)
        if backend == "nccl":
            assert (env["NCCL_HOST_IP"], env["NCCL_PORT"], env["MLX_WORLD_SIZE"]) == (testbed.ips[0], "12345", "4")
            assert env["CUDA_VISIBLE_DEVICES"] == "0" and env["devices"] is None
        else:
            assert env["MLX_JACCL_COORDINATOR"] == f"{testbed.ips[0]}:4242"
            assert env.get("MLX_JACCL_RING") == ("1" if backend == "jaccl-ring" else None)
            assert env["devices"] == [h.rdma for h in hosts]


UNITTEST_FILE = textwrap.dedent("""
    import unittest
    import mlx.core as mx

    class TestRing(unittest.TestCase):
        @classmethod
        def setUpClass(cls):
            cls.group = mx.distributed.init(backend="ring", strict=True)

        def test_size(self):
            self.assertEqual(self.group.size(), 4)

        def test_all_sum(self):
            x = mx.distributed.all_sum(mx.ones(8) * self.group.rank())
            self.assertTrue(mx.all(x == sum(range(self.group.size()))).item())

        def test_all_gather(self):
            x = mx.distributed.all_gather(mx.array([self.group.rank()]))
            self.assertEqual(x.tolist(), list(range(self.group.size())))

    if __name__ == "__main__":
        unittest.main()
""")


@pytest.mark.parametrize("n_hosts,per_host", [(4, 1), (2, 2)])
def test_cli_on_hosts_mlx_style_unittest_file(testbed, tmp_path, n_hosts, per_host):
    """MLX's distributed test style: a unittest file on 4 ranks across hosts; OK on every rank, exit 0."""
    test_file = tmp_path / "test_ring.py"
    test_file.write_text(UNITTEST_FILE)
    args = [*testbed.cli_ssh_args(), "--hosts", ",".join(testbed.ips[:n_hosts]), "-n", str(per_host)]
    res = cli([*args, str(test_file)], timeout=120)
    assert res.returncode == 0, res.stderr
    for r in range(4):
        assert f"[rank {r}] Ran 3 tests" in res.stderr and f"[rank {r}] OK" in res.stderr, res.stderr


def test_cli_on_hosts_is_idle_while_ranks_sleep(testbed):
    args = [*testbed.cli_ssh_args(), "--hosts", ",".join(testbed.ips)]
    code = "import time; print('ready', flush=True); time.sleep(3); print('done', flush=True)"
    run = LiveCLI([*args, PY, "-c", code])
    run.wait_for("ready", 4)
    t0, c0 = time.monotonic(), cpu_seconds(run.proc.pid)
    run.wait_for("done", 1, timeout=20)
    t1, c1 = time.monotonic(), cpu_seconds(run.proc.pid)
    assert run.finish(20) == 0, run.text
    assert (c1 - c0) / (t1 - t0) <= 0.01, f"launcher used {c1 - c0:.3f} s CPU in {t1 - t0:.2f} s"


def test_cli_ctrl_c_reaches_remote_ranks(testbed):
    code = ("import signal, sys, time\n"
            "signal.signal(signal.SIGINT, lambda *a: (print('got SIGINT', flush=True), sys.exit(0)))\n"
            "print('ready', flush=True); time.sleep(60)")
    run = LiveCLI([*testbed.cli_ssh_args(), "--hosts", ",".join(testbed.ips[:2]), PY, "-c", code])
    run.wait_for("ready", 2)
    run.proc.send_signal(signal.SIGINT)
    run.wait_for("got SIGINT", 2)
    assert run.finish(15) == 0, run.text


def test_mixed_local_and_remote_ranks(testbed, monkeypatch):
    monkeypatch.setenv("MLX_JUPYTER_CHECK_BACKEND", "0")   # nccl's plan, on a machine that has no NCCL
    out, on_output = collector()
    hosts = [Host("127.0.0.1", ["127.0.0.1"]), *hosts_of(testbed, 1)]
    launcher = Launcher(["hostname"], hosts=hosts, backend="nccl", ssh_options=testbed.ssh_options(),
                        on_output=on_output).start()
    assert launcher.wait(30) == 0
    assert stdout_of(out)[1] == ["h1"]


MPI_CODE = ("import socket, sys, mlx.core as mx; g = mx.distributed.init(backend='mpi', strict=True); "
            "print(socket.gethostname(), g.rank(), g.size(), mx.distributed.all_sum(mx.array(1)).item(), "
            "sys.stdin.readline().strip(), flush=True)")
MPI_ENV = {"OMPI_ALLOW_RUN_AS_ROOT": "1", "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM": "1"}  # the tests run as root


@pytest.fixture
def mpirun():
    import shutil
    path = shutil.which("mpirun")
    if path is None:
        pytest.skip("mpirun not installed (apt-get install openmpi-bin)")
    return path


def _mpi_args(bed, tmp_path) -> list[str]:
    """mpirun's own ssh (to start its daemons) on the bed: a config whose User is wrong, so the
    hostfile's ``root@`` must reach mpirun for the launch to work."""
    cfg = tmp_path / "ssh_config"
    cfg.write_text(f"Host *\n  User nosuchuser\n  IdentityFile {bed.key}\n  UserKnownHostsFile {bed.known_hosts}\n"
                   "  StrictHostKeyChecking yes\n  BatchMode yes\n")
    subnet = f"{bed.net}.0/24"
    return ["--backend", "mpi", "--hosts", ",".join(f"root@{ip}" for ip in bed.ips),
            "--mpi-arg", f"--mca plm_rsh_args '-F {cfg}'",
            "--mpi-arg", f"--mca btl_tcp_if_include {subnet} --mca oob_tcp_if_include {subnet}"]


def test_mpi_backend_on_four_hosts(testbed, mpirun, tmp_path):
    """MLX's MPI backend initialises on 4 hosts; lines prefixed per rank, stdin broadcast, user@ kept."""
    res = cli([*_mpi_args(testbed, tmp_path), "--env", "A=1", PY, "-c", MPI_CODE], stdin="hello\n",
              env=MPI_ENV, timeout=90)
    assert res.returncode == 0, res.stderr
    assert sorted(res.stdout.splitlines()) == [f"[rank {r}] h{r + 1} {r} 4 4 hello" for r in range(4)]


def test_mpi_backend_names_the_failing_rank_and_its_host(testbed, mpirun, tmp_path):
    code = "import os, sys; r = int(os.environ['OMPI_COMM_WORLD_RANK']); print('err', r, file=sys.stderr); sys.exit(5 if r == 2 else 0)"
    res = cli([*_mpi_args(testbed, tmp_path), PY, "-c", code], env=MPI_ENV, timeout=90)
    assert res.returncode == 5, res.stderr
    assert f"rank 2 on root@{testbed.ips[2]} exited with code 5 (the first to fail); mpirun exited with code 5" in res.stderr, res.stderr
    assert "[rank 2] err 2" in res.stderr and "err" not in res.stdout   # the others may be gone before they print


def test_mpi_backend_local_and_failure_code(mpirun):
    res = cli(["--backend", "mpi", "-n", "2", PY, "-c", MPI_CODE], env=MPI_ENV, timeout=60, stdin="")
    assert res.returncode == 0, res.stderr
    assert sorted(line.split()[:2] for line in res.stdout.splitlines()) == [["[rank", "0]"], ["[rank", "1]"]]
    res = cli(["--backend", "mpi", "-n", "2", PY, "-c", "import os, sys; sys.exit(3 * int(os.environ['OMPI_COMM_WORLD_RANK']))"],
              env=MPI_ENV, timeout=60)
    assert res.returncode == 3 and "rank 1 on localhost exited with code 3" in res.stderr, res.stderr
    assert "mpirun exited with code 3" in res.stderr


def test_more_ranks_per_host_than_sshd_sessions(testbed, monkeypatch):
    # sshd allows 10 sessions per connection by default; 12 ranks on one host need a second connection
    monkeypatch.setenv("MLX_JUPYTER_CHECK_BACKEND", "0")   # nccl's plan, on hosts that cannot run it
    out, on_output = collector()
    code = "import os; print(os.environ['MLX_RANK'])"
    launcher = Launcher([PY, "-c", code], hosts=hosts_of(testbed, 1), repeat_hosts=12, backend="nccl",
                        ssh_options=testbed.ssh_options(max_sessions=4), on_output=on_output).start()
    assert launcher.wait(60) == 0, out
    assert sorted(int(lines[0]) for lines in stdout_of(out).values()) == list(range(12))
    assert {conn for r, conn in launcher.job.connections.rank_conn.items()}.__len__() == 4  # 3 ranks + the watchdog session each


def test_remote_python_ranks_get_ctrl_c_as_keyboard_interrupt(testbed):
    """A remote rank starts with SIGINT at its default, as a local one does (a shell's ``&`` would leave it
    ignored), so the launcher's forwarded Ctrl-C raises KeyboardInterrupt in a plain script."""
    code = "import time; print('ready', flush=True); time.sleep(60)"
    run = LiveCLI([*testbed.cli_ssh_args(), "--hosts", ",".join(testbed.ips[:2]), PY, "-c", code])
    run.wait_for("ready", 2)
    run.proc.send_signal(signal.SIGINT)
    run.wait_for(r"^\[rank \d\] KeyboardInterrupt$", 2, timeout=10)
    assert run.finish(15) != 0, run.text


#: a sitecustomize that sends its rank a SIGUSR1 before any code of ours runs (not the launcher: no MLX_RANK)
EARLY_USR1 = "import os, signal\nif 'MLX_RANK' in os.environ:\n    os.kill(os.getpid(), signal.SIGUSR1)\n"


def test_a_remote_rank_survives_a_where_signal_before_its_boot_code(testbed, tmp_path):
    """--where-on-signal: a SIGUSR1 that reaches a remote rank before its boot code runs (here: sent by
    the rank to itself from sitecustomize) is ignored, not fatal."""
    (tmp_path / "sitecustomize.py").write_text(EARLY_USR1)
    script = tmp_path / "s.py"
    script.write_text("print('alive', flush=True)\n")
    run = LiveCLI([*testbed.cli_ssh_args(), "--hosts", ",".join(testbed.ips[:2]), "--where-on-signal",
                   "--env", f"PYTHONPATH={tmp_path}{os.pathsep}{ROOT}", PY, str(script)])
    assert run.finish(30) == 0, run.text
    assert len(run.wait_for(r"^\[rank \d\] alive$", 2)) == 2, run.text
