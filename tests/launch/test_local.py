"""The launcher on this machine (no ssh): the Python API and the CLI."""

from __future__ import annotations

import json
import os
import signal
import textwrap
import threading
import time
from pathlib import Path

import pytest

from launch_helpers import collector, PY, ROOT, LiveCLI, cli, cpu_seconds, wait_pids_gone, watcher_of
from needs import require_core
from mlx_jupyter.launch import LaunchError, Launcher
from mlx_jupyter.launch.command import build_parser, split_argv
from mlx_jupyter.net.ssh import SSHOptions

pytestmark = pytest.mark.timeout(120)

PRINT_ENV = "import os, json; print(json.dumps({k: os.environ.get(k) for k in ['MLX_RANK', 'MLX_HOSTFILE', 'MLX_JUPYTER_TOKEN', 'EXTRA']}))"


def test_api_env_output_and_exit_callbacks(tmp_path):
    out, on_output = collector()
    exits = {}
    launcher = Launcher([PY, "-c", PRINT_ENV + "; import sys; print('err', file=sys.stderr)"], hosts="127.0.0.1",
                        repeat_hosts=3, rank_env=lambda r: {"EXTRA": f"x{r}"}, on_output=on_output,
                        on_exit=lambda r, c: exits.__setitem__(r, c))
    launcher.start()
    assert [r.rank for r in launcher.ranks] == [0, 1, 2] and all(r.pid for r in launcher.ranks)
    assert launcher.wait(30) == 0
    assert exits == {0: 0, 1: 0, 2: 0}
    envs = {r: json.loads(line) for r, s, line in out if s == "stdout"}
    assert {r: e["MLX_RANK"] for r, e in envs.items()} == {0: "0", 1: "1", 2: "2"}
    assert {e["EXTRA"] for e in envs.values()} == {"x0", "x1", "x2"}
    tokens = {e["MLX_JUPYTER_TOKEN"] for e in envs.values()}
    assert len(tokens) == 1 and len(tokens.pop()) == 32
    assert sorted(r for r, s, line in out if s == "stderr" and line == "err") == [0, 1, 2]
    hostfile = envs[0]["MLX_HOSTFILE"]
    assert not os.path.exists(hostfile), "the ring hostfile temp file must be removed"
    assert all(r.state == "exited" and r.returncode == 0 for r in launcher.ranks)


def test_fresh_token_per_launch():
    tokens = []
    for _ in range(2):
        out, on_output = collector()
        launcher = Launcher([PY, "-c", PRINT_ENV], on_output=on_output).start()
        assert launcher.wait(30) == 0
        tokens.append(json.loads(out[0][2])["MLX_JUPYTER_TOKEN"])
    assert tokens[0] != tokens[1]


def test_one_rank_run_initialises_mlx():
    out, on_output = collector()
    code = "import mlx.core as mx; g = mx.distributed.init(); print(g.rank(), g.size(), mx.distributed.all_sum(mx.array(3)).item())"
    launcher = Launcher([PY, "-c", code], repeat_hosts=1, on_output=on_output).start()
    assert launcher.wait(60) == 0, out
    assert ("0 1 3") in [line for _, s, line in out if s == "stdout"]


def test_failure_terminates_the_others_and_propagates_the_code():
    code = "import os, sys, time; r = int(os.environ['MLX_RANK']); print('ready', flush=True); time.sleep(0.5) if r == 2 else time.sleep(60); sys.exit(7)"
    launcher = Launcher([PY, "-c", code], repeat_hosts=4, on_output=lambda *a: None).start()
    pids = [r.pid for r in launcher.ranks]
    t0 = time.monotonic()
    assert launcher.wait(30) == 7
    assert time.monotonic() - t0 < 0.5 + 2.0 + 1.0
    assert not wait_pids_gone(pids, 2.0)
    states = {r.rank: r.state for r in launcher.ranks}
    assert states == {0: "killed", 1: "killed", 2: "exited", 3: "killed"}
    assert "rank 2 on 127.0.0.1 exited with code 7" in launcher.summary()


def test_stop_kills_the_whole_process_group(tmp_path):
    ready = threading.Event()
    code = "import subprocess, time; p = subprocess.Popen(['sleep', '60']); print('child', p.pid, flush=True); time.sleep(60)"
    children = []

    def on_output(rank, stream, line):
        if line.startswith("child"):
            children.append(int(line.split()[1]))
            if len(children) == 2:
                ready.set()
    launcher = Launcher([PY, "-c", code], repeat_hosts=2, on_output=on_output).start()
    assert ready.wait(20)
    launcher.stop(timeout=2.0)
    assert not wait_pids_gone([r.pid for r in launcher.ranks] + children, 2.0)
    assert all(r.state == "killed" for r in launcher.ranks)


def test_signal_reaches_the_ranks():
    got = threading.Event()
    ready = threading.Event()
    code = ("import signal, sys, time\n"
            "signal.signal(signal.SIGUSR1, lambda *a: (print('usr1', flush=True), sys.exit(0)))\n"
            "print('ready', flush=True); time.sleep(60)")
    seen = []

    def on_output(rank, stream, line):
        seen.append(line)
        if seen.count("ready") == 2:
            ready.set()
        if seen.count("usr1") == 2:
            got.set()
    launcher = Launcher([PY, "-c", code], repeat_hosts=2, on_output=on_output).start()
    assert ready.wait(20)
    launcher.signal(signal.SIGUSR1)
    assert got.wait(10)
    assert launcher.wait(10) == 0


def test_py_script_runs_with_python_and_stdin_is_broadcast(tmp_path):
    script = tmp_path / "echo_stdin.py"
    script.write_text("import sys\nprint('line:', sys.stdin.readline().strip())\n")
    out, on_output = collector()
    launcher = Launcher([str(script)], repeat_hosts=2, on_output=on_output, stdin=True).start()
    launcher.write_stdin("hello ranks\n")
    launcher.close_stdin()
    assert launcher.wait(30) == 0
    assert sorted(out) == [(0, "stdout", "line: hello ranks"), (1, "stdout", "line: hello ranks")]


def test_start_errors_are_clear():
    with pytest.raises(LaunchError, match="rank 0 on 127.0.0.1: command 'no-such-cmd-xyz' not found"):
        Launcher(["no-such-cmd-xyz"]).start()
    with pytest.raises(LaunchError, match="working directory"):
        Launcher(["true"], cwd="/no/such/dir").start()


def test_a_host_name_that_does_not_resolve_is_named(monkeypatch):
    """No DNS query leaves the machine: the resolver is this machine's getaddrinfo, made to fail."""
    import socket

    def no_such_name(host, *args, **kwargs):
        raise socket.gaierror(socket.EAI_NONAME, "Name or service not known")
    monkeypatch.setattr(socket, "getaddrinfo", no_such_name)
    with pytest.raises(LaunchError, match=r"(?s)ring: every rank needs an IP address.*host 'mac-1' \(rank 0\): it does "
                                          r"not resolve \(Name or service not known\).*hostfile with \"ips\""):
        Launcher(["true"], hosts="mac-1", ssh_options=SSHOptions(config=[])).start()


def test_partial_lines_are_flushed_so_prompts_show():
    prompt = threading.Event()
    code = "import sys, time; sys.stdout.write('(Pdb) '); sys.stdout.flush(); time.sleep(60)"
    launcher = Launcher([PY, "-c", code], on_output=lambda r, s, line: line == "(Pdb) " and prompt.set()).start()
    try:
        assert prompt.wait(10)
    finally:
        launcher.stop()


def test_real_mlx_ring_on_four_local_ranks(port_block):
    base = port_block(4)
    out, on_output = collector()
    code = ("import mlx.core as mx; g = mx.distributed.init(backend='ring', strict=True); "
            "x = mx.distributed.all_sum(mx.array([g.rank() + 1.0, 1.0])); print('sum', g.rank(), g.size(), x.tolist())")
    launcher = Launcher([PY, "-c", code], repeat_hosts=4, starting_port=base, on_output=on_output).start()
    assert launcher.wait(90) == 0, out
    sums = sorted(line for _, s, line in out if line.startswith("sum"))
    assert sums == [f"sum {r} 4 [10.0, 4.0]" for r in range(4)]


# ------------------------------------------------------------------- CLI ----

def test_options_end_where_the_command_begins():
    parser = build_parser()
    assert split_argv(["-n", "2", "python", "t.py", "--verbose"], parser) == (["-n", "2"], ["python", "t.py", "--verbose"])
    assert split_argv(["--verbose", "--", "-x"], parser) == (["--verbose"], ["-x"])
    assert split_argv(["-n2", "--env=A=1", "--env", "B=2", "cmd"], parser) == (["-n2", "--env=A=1", "--env", "B=2"], ["cmd"])
    res = cli(["-n", "2", PY, "-c", "import sys; print(sys.argv[1:])", "--verbose", "-n", "3"])
    assert res.returncode == 0, res.stderr
    assert res.stdout.count("['--verbose', '-n', '3']") == 2


def test_cli_exit_status_and_summary():
    res = cli(["-n", "3", "--", PY, "-c", "import os, sys; r = int(os.environ['MLX_RANK']); sys.exit(3 if r == 1 else 0)"])
    assert res.returncode == 3
    assert "rank 1 on 127.0.0.1 exited with code 3" in res.stderr
    assert "Traceback" not in res.stderr


def test_cli_prefix_and_raw_output():
    res = cli(["-n", "2", PY, "-c", "print('hi')"])
    assert sorted(res.stdout.splitlines()) == ["[rank 0] hi", "[rank 1] hi"]
    res = cli(["-n", "2", "--output", "raw", PY, "-c", "print('hi')"])
    assert res.stdout.splitlines() == ["hi", "hi"]
    res = cli(["-n", "1", PY, "-c", "print('one')"])
    assert res.stdout == "one\n"


def test_cli_stdin_broadcast():
    res = cli(["-n", "3", "--output", "raw", PY, "-c", "import sys; print(sys.stdin.read().split())"], stdin="a b\nc\n")
    assert res.returncode == 0 and res.stdout.splitlines() == ["['a', 'b', 'c']"] * 3


def test_cli_usage_errors_are_one_line(tmp_path):
    for args, match in [
        (["missing_script.py"], "not found"),
        (["--hosts", "a,,b", "true"], "entry 2 is empty"),
        (["--hostfile", str(tmp_path / "none.json"), "true"], "none.json': cannot open it"),
        ([], "no command given"),
        (["--hosts", "a;b", "true"], "not a valid host name"),
    ]:
        res = cli(args)
        assert res.returncode == 2, (args, res.stderr)
        assert match in res.stderr and "Traceback" not in res.stderr
    res = cli(["--print-python"])
    assert res.returncode == 0 and res.stdout.strip() == PY
    res = cli(["-n", "1", "--env", "BAD-KEY=1", "--env", "GOOD=1", PY, "-c", "import os; print(os.environ['GOOD'])"])
    assert res.returncode == 0 and "BAD-KEY" in res.stderr and res.stdout == "1\n"


def test_cli_hostfile_object_form_sets_backend_and_env(tmp_path):
    hf = tmp_path / "hosts.json"
    hf.write_text(json.dumps({"backend": "nccl", "envs": ["FROM_HF=1"], "hosts": [{"ssh": "127.0.0.1", "ips": ["127.0.0.1"]}]}))
    res = cli(["--hostfile", str(hf), "-n", "2", "--output", "raw", PY, "-c",
               "import os; print(os.environ['FROM_HF'], os.environ['MLX_WORLD_SIZE'], os.environ['CUDA_VISIBLE_DEVICES'])"],
              env={"MLX_JUPYTER_CHECK_BACKEND": "0"})   # nccl's environment, on a machine that may have no NCCL
    assert res.returncode == 0, res.stderr
    assert sorted(res.stdout.splitlines()) == ["1 2 0", "1 2 1"]


def test_cli_ctrl_c_is_forwarded_then_terminates():
    graceful = textwrap.dedent("""
        import signal, sys, time
        signal.signal(signal.SIGINT, lambda *a: (print('got SIGINT', flush=True), sys.exit(0)))
        print('ready', flush=True); time.sleep(60)
    """)
    run = LiveCLI(["-n", "2", PY, "-c", graceful])
    run.wait_for("ready", 2)
    run.proc.send_signal(signal.SIGINT)
    run.wait_for("got SIGINT", 2)
    assert run.finish(10) == 0, run.text

    stubborn = "import signal, time; signal.signal(signal.SIGINT, signal.SIG_IGN); print('ready', flush=True); time.sleep(60)"
    run = LiveCLI(["-n", "2", PY, "-c", stubborn])
    run.wait_for("ready", 2)
    run.proc.send_signal(signal.SIGINT)
    run.wait_for("forwarding Ctrl-C")
    run.proc.send_signal(signal.SIGINT)
    code = run.finish(10)
    assert code == 128 + signal.SIGTERM, run.text
    assert "terminated" in run.text


def test_cli_is_idle_while_ranks_sleep():
    code = "import time; print('ready', flush=True); time.sleep(3); print('done', flush=True)"
    run = LiveCLI(["-n", "2", PY, "-c", code])
    run.wait_for("ready", 2)
    watcher = watcher_of(run.proc.pid)
    t0, c0, w0 = time.monotonic(), cpu_seconds(run.proc.pid), cpu_seconds(watcher.pid)
    run.wait_for("done", 1, timeout=20)
    t1, c1, w1 = time.monotonic(), cpu_seconds(run.proc.pid), cpu_seconds(watcher.pid)
    assert run.finish(20) == 0
    assert (c1 - c0) / (t1 - t0) <= 0.01, f"launcher used {c1 - c0:.3f} s CPU in {t1 - t0:.2f} s"
    assert w1 - w0 <= 0.01, f"the local watchdog used {w1 - w0:.3f} s CPU in {t1 - t0:.2f} s"


def test_unittest_style_multi_rank_file(tmp_path, port_block):
    test_file = tmp_path / "test_dist.py"
    test_file.write_text(textwrap.dedent("""
        import unittest
        import mlx.core as mx

        class TestRing(unittest.TestCase):
            @classmethod
            def setUpClass(cls):
                cls.group = mx.distributed.init(backend="ring", strict=True)

            def test_all_sum(self):
                g = self.group
                x = mx.distributed.all_sum(mx.ones(8) * g.rank())
                self.assertTrue(mx.all(x == sum(range(g.size()))).item())

            def test_all_gather(self):
                g = self.group
                x = mx.distributed.all_gather(mx.array([g.rank()]))
                self.assertEqual(x.tolist(), list(range(g.size())))

        if __name__ == "__main__":
            unittest.main()
    """))
    res = cli(["-n", "4", "-p", str(port_block(4)), str(test_file)], timeout=120)
    assert res.returncode == 0, res.stderr
    for r in range(4):
        assert f"[rank {r}] OK" in res.stderr, res.stderr


def test_no_temp_files_left(tmp_path):
    before = set(Path("/tmp").glob("mlx-jupyter*"))
    res = cli(["-n", "2", PY, "-c", "import os; print(open(os.environ['MLX_HOSTFILE']).read())"])
    assert res.returncode == 0
    assert set(Path("/tmp").glob("mlx-jupyter*")) <= before
    assert ROOT.exists()


def test_cli_sigterm_stops_every_rank():
    code = "import os, time; print('ready', os.getpid(), flush=True); time.sleep(60)"
    run = LiveCLI(["-n", "2", PY, "-c", code])
    lines = run.wait_for("ready", 2)
    pids = [int(x.split()[-1]) for x in lines]
    run.proc.send_signal(signal.SIGTERM)
    assert run.finish(10) == 128 + signal.SIGTERM
    assert not wait_pids_gone(pids, 2.0)


def test_cli_stderr_stays_on_stderr():
    res = cli(["-n", "2", PY, "-c", "import sys; print('to-err', file=sys.stderr); print('to-out')"])
    assert sorted(res.stdout.splitlines()) == ["[rank 0] to-out", "[rank 1] to-out"]
    assert "[rank 0] to-err" in res.stderr and "to-err" not in res.stdout


# ------------------------------------------------------- CLI flag coverage --

ENV_JSON = "import os, json; print(json.dumps({{k: os.environ.get(k) for k in {keys!r}}}))"


def _json_lines(res) -> list[dict]:
    assert res.returncode == 0, res.stderr
    return [json.loads(line) for line in res.stdout.splitlines()]


def test_cli_python_runs_py_scripts(tmp_path):
    record = tmp_path / "ran"
    wrapper = tmp_path / "my python"
    wrapper.write_text(f"#!/bin/sh\necho \"$@\" >> '{record}'\nexec '{PY}' \"$@\"\n")
    wrapper.chmod(0o755)
    script = tmp_path / "hello.py"
    script.write_text("import sys; print('hello from', sys.argv[1:])\n")
    res = cli(["-n", "2", "--output", "raw", "--python", str(wrapper), str(script), "a b"])
    assert res.returncode == 0, res.stderr
    assert res.stdout.splitlines() == ["hello from ['a b']"] * 2
    assert record.read_text().splitlines() == [f"{script} a b"] * 2   # the wrapper ran, once per rank
    res = cli(["-n", "1", "--python", str(wrapper), "echo", "not a script"])       # other commands run as given
    assert res.stdout == "not a script\n" and record.read_text().count("\n") == 2


def test_cli_no_verify_script(tmp_path):
    bindir = tmp_path / "bin"
    bindir.mkdir()
    tool = bindir / "only-on-the-ranks-xyz"
    tool.write_text("#!/bin/sh\necho tool ran\n")
    tool.chmod(0o755)
    res = cli(["only-on-the-ranks-xyz"])
    assert res.returncode == 2 and "not found on PATH; pass --no-verify-script" in res.stderr
    path = f"{bindir}{os.pathsep}{os.environ['PATH']}"
    res = cli(["-n", "1", "--no-verify-script", "--env", f"PATH={path}", "only-on-the-ranks-xyz"])
    assert res.returncode == 0 and res.stdout == "tool ran\n", res.stderr


def test_cli_cwd(tmp_path):
    (tmp_path / "here.py").write_text("import os; print(os.getcwd())\n")
    res = cli(["-n", "2", "--output", "raw", "--cwd", str(tmp_path), "here.py"])   # found in --cwd, run there
    assert res.returncode == 0, res.stderr
    assert res.stdout.splitlines() == [str(tmp_path)] * 2
    res = cli(["--cwd", str(tmp_path / "missing"), "true"])
    assert res.returncode == 1 and "working directory" in res.stderr and "Traceback" not in res.stderr


def test_cli_connections_per_ip_sets_the_hostfile_addresses(port_block):
    base = port_block(4)
    code = "import os; print(open(os.environ['MLX_HOSTFILE']).read())"
    res = cli(["-n", "2", "--output", "raw", "-p", str(base), "--connections-per-ip", "2", PY, "-c", code])
    plans = _json_lines(res)
    expected = [[f"127.0.0.1:{base}", f"127.0.0.1:{base + 1}"], [f"127.0.0.1:{base + 2}", f"127.0.0.1:{base + 3}"]]
    assert plans == [expected, expected]


def test_cli_nccl_port():
    res = cli(["-n", "2", "--output", "raw", "--backend", "nccl", "--nccl-port", "23456", PY, "-c",
               ENV_JSON.format(keys=["NCCL_PORT", "NCCL_HOST_IP", "MLX_WORLD_SIZE"])],
              env={"MLX_JUPYTER_CHECK_BACKEND": "0"})   # nccl's environment, on a machine that may have no NCCL
    assert _json_lines(res) == [{"NCCL_PORT": "23456", "NCCL_HOST_IP": "127.0.0.1", "MLX_WORLD_SIZE": "2"}] * 2


def test_cli_verbose_logs_steps_and_asks_mlx_for_more(port_block):
    res = cli(["-n", "2", "--output", "raw", "--verbose", "-p", str(port_block(2)), PY, "-c",
               ENV_JSON.format(keys=["MLX_RING_VERBOSE"])])
    assert _json_lines(res) == [{"MLX_RING_VERBOSE": "1"}] * 2
    assert "mlx-jupyter launch: starting 2 rank(s)" in res.stderr
    res = cli(["-n", "2", "--output", "raw", "-p", str(port_block(2)), PY, "-c", ENV_JSON.format(keys=["MLX_RING_VERBOSE"])])
    assert _json_lines(res) == [{"MLX_RING_VERBOSE": None}] * 2 and "mlx-jupyter launch:" not in res.stderr


def test_cli_plain_list_hostfile(tmp_path, port_block):
    hf = tmp_path / "hosts.json"
    hf.write_text(json.dumps([{"ssh": "127.0.0.1", "ips": ["127.0.0.1"]}, {"ssh": "localhost", "ips": ["127.0.0.1"]}]))
    base = port_block(2)
    code = ("import os, json, mlx.core as mx; g = mx.distributed.init(backend='ring', strict=True); "
            "print(json.dumps([g.rank(), g.size(), json.load(open(os.environ['MLX_HOSTFILE']))]))")
    res = cli(["--hostfile", str(hf), "-p", str(base), "--output", "raw", PY, "-c", code], timeout=90)
    rows = sorted(_json_lines(res))
    plan = [[f"127.0.0.1:{base}"], [f"127.0.0.1:{base + 1}"]]
    assert rows == [[0, 2, plan], [1, 2, plan]]


def test_cli_one_rank_with_our_core():
    require_core()
    code = ("import numpy as np; from mlx_jupyter import distributed as d; g = d.init(backend='ring', strict=True); "
            "print(g.rank(), g.size(), list(map(int, d.all_sum(np.arange(3) + 1))))")
    res = cli(["-n", "1", PY, "-c", code], timeout=60)
    assert res.returncode == 0, res.stderr
    assert res.stdout == "0 1 [1, 2, 3]\n"   # one rank: no [rank 0] prefix


def test_ctrl_c_on_a_hung_mlx_collective_ends_with_one_line_per_rank(tmp_path):
    """Rank 0 waits in MLX's all_sum for rank 1, which sleeps; Ctrl-C: rank 1 stops, rank 0's ring
    fails. MLX's repeated socket errors and CPython's exit dump come as one line for rank 0."""
    script = tmp_path / "hang.py"
    script.write_text(textwrap.dedent("""\
        import sys, threading, time
        import mlx.core as mx
        world = mx.distributed.init(backend="ring", strict=True)
        if world.rank() == 1:
            print("ready", flush=True)
            time.sleep(120)
        main = threading.main_thread().ident
        def say_when_waiting():   # the main thread holds the GIL until it blocks in MLX's eval
            while sys._current_frames()[main].f_lineno != 13:
                time.sleep(0.005)
            print("ready", flush=True)
        threading.Thread(target=say_when_waiting, daemon=True).start()
        mx.eval(mx.distributed.all_sum(mx.ones(1 << 20), group=world))
    """))
    with LiveCLI(["-n", "2", "--backend", "ring", "--", PY, str(script)]) as run:
        # Ctrl-C once rank 0 waits in the collective (a rank that printed "ready" before it was a
        # line short of it: its Ctrl-C came as a KeyboardInterrupt's traceback instead)
        run.wait_for(r"^\[rank \d\] ready$", count=2, timeout=60)
        run.proc.send_signal(signal.SIGINT)
        code = run.finish(timeout=60)
    err = run.streams["stderr"]
    assert code != 0, run.text
    rank0 = [line for line in err if line.startswith("[rank 0]")]
    assert len(rank0) == 1, "\n".join(err)  # one line: the ring's errors and the exit dump, folded
    assert not any("object address" in line or "lost sys.stderr" in line for line in err), "\n".join(err)
    assert sum("[ring]" in line for line in err) <= 1, "\n".join(err)
    assert err[-1].startswith("mlx-jupyter launch: rank "), "\n".join(err)  # the summary: how each rank ended


def test_ending_noise_is_held_and_said_in_one_line():
    from mlx_jupyter.launch.streams import EndingNoise

    noise = EndingNoise()
    assert not noise.hold(0, "a real error")
    assert all(noise.hold(0, "[ring] Socket 4 was closed by the peer") for _ in range(3))
    assert noise.line(0) == "[ring] Socket 4 was closed by the peer (and 2 more MLX ring socket errors like it)"
    for line in ("object address  : 0x7f151e8e86a0", "object refcount : 2", "object type name: RuntimeError",
                 "object repr     : RuntimeError('[ring] connection to a peer was lost')", "lost sys.stderr"):
        assert noise.hold(1, line)
    assert noise.line(1) == "RuntimeError('[ring] connection to a peer was lost') at exit" and noise.line(1) is None


def test_ring_errors_interleaved_by_mlxs_threads_are_held_too():
    """MLX's two ring threads write at once: their words interleave within a line (seen: the Ctrl-C test)."""
    from mlx_jupyter.launch.streams import EndingNoise

    noise = EndingNoise()
    assert noise.hold(0, "[ring][ring]  SocketSocket  34  was closed by the peerwas closed by the peer")
    assert noise.hold(0, "")   # the newline the pair moved
    assert noise.hold(0, "[ring][ring]  SocketSocket 4 3 was closed by the peer")
    assert noise.hold(0, "[ring] Socket 3 was closed by the peer")
    assert noise.hold(0, "3 was closed by the peer")   # a fragment a pair split onto a line of its own
    assert noise.line(0) == ("[ring] socket errors on several threads at once "
                             "(and 4 more MLX ring socket errors like it)")
    # a user's line that mentions the ring, and a blank line before any ring error, are not noise
    assert not noise.hold(1, "[ring] my own note: socket 3 is slow")
    assert not noise.hold(1, "")
    assert not noise.hold(1, "[ring]] Socket 3 was closed by the peer!")
    assert not noise.hold(1, "3 was closed by the peer")   # no ring error held for rank 1 yet: its own line
