"""Cable check, I/O part, over scripted runners: rounds, argv, retries, failures named, time bounds; the CLI flag.

The agent itself runs for real on 127.0.0.1 here; on real sshd hosts in tests/config_e2e/test_cablecheck_e2e.py.
"""

from __future__ import annotations

import asyncio
import io
import sys
import time

import pytest

from check_runner import CheckRunner, Link
from fake_runner import FakeRunner
from tb_fixtures import FIXTURES
from mlx_jupyter import configurator
from mlx_jupyter.configurator import measure
from mlx_jupyter.configurator.measure import CheckOptions, check
from mlx_jupyter.topology import CommandResult, Topology
from mlx_jupyter.topology.cablecheck import Target, targets

MESH = FIXTURES / "four-m3-ultra-mesh"
TRI = FIXTURES / "three-macs-triangle"


def run_check(runner, ts, **kw):
    return asyncio.run(check(runner, ts, CheckOptions(**kw)))


def _cmdline(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as fh:
            return fh.read().decode(errors="replace")
    except OSError:   # no /proc (macOS), or gone already
        return ""


class LocalRunner:
    """Runs the argv on this machine (every "host" is here); ``seen``: (token sent, the agent's cmdline)."""

    def __init__(self) -> None:
        self.seen: list[tuple[str, str]] = []

    async def run(self, host, argv, stdin=""):
        proc = await asyncio.create_subprocess_exec(*argv, stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE,
                                                    stderr=asyncio.subprocess.PIPE)
        try:
            proc.stdin.write(stdin.encode())   # and held open, as ssh holds it
            self.seen.append((stdin.strip(), _cmdline(proc.pid)))
            out, err, _ = await asyncio.wait_for(asyncio.gather(proc.stdout.read(), proc.stderr.read(), proc.wait()), 30)
        except BaseException:  # cancelled (the other end failed): do not leave it running
            proc.kill()
            await proc.wait()
            raise
        return CommandResult(proc.returncode, out.decode(), err.decode())


@pytest.mark.timeout(60)
def test_agent_measures_on_loopback():
    t = Target(0, "here", "127.0.0.1", "there", "127.0.0.1", None, "loopback")
    runner = LocalRunner()
    [r] = run_check(runner, [t], seconds=0.2, python=sys.executable, cable_timeout=20).results
    assert r.error is None, r.error
    assert len(runner.seen) == 2 and all(len(tok) == 32 and tok not in cmd for tok, cmd in runner.seen), \
        "the agents' token is on their command line"
    assert r.a_to_b_gbps > 0 and r.b_to_a_gbps > 0 and 0 < r.rtt_ms < 1000


def test_agent_cannot_listen_on_an_address_this_host_lacks():
    # only the receiver runs: binding 192.0.2.1 (TEST-NET-1, not on this machine) fails, nothing is dialled
    import subprocess

    argv = measure.agent_argv(sys.executable, "serve", bind="192.0.2.1", port=47001, timeout=5)
    # stdin held open, as ssh holds it: the agent ends when it closes, which is another message
    proc = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    proc.stdin.write("t\n")
    proc.stdin.flush()
    try:
        code = proc.wait(timeout=30)
        out, err = proc.stdout.read(), proc.stderr.read()
    finally:
        proc.stdin.close()
        proc.kill()
        proc.wait()
    assert code == 1 and out == "", err
    assert err.startswith("cablecheck serve: cannot listen on 192.0.2.1 port 47001: ")
    assert "apply the setup first" in err


def test_rounds_run_host_disjoint_cables_at_once():
    ts = targets(Topology.from_recordings(MESH))
    runner = CheckRunner({})
    rep = run_check(runner, ts)
    assert rep.ok and len(rep.results) == 6
    assert runner.peak_per_host == 1  # a host is in one transfer at a time
    assert runner.peak_total == 4  # two cables (four ends) at once in every round


def test_agents_bind_the_plan_addresses():
    ts = targets(Topology.from_recordings(TRI))
    runner = CheckRunner({})
    run_check(runner, ts[:1], python="/opt/py3", seconds=0.5)
    (send_host, _, send), (serve_host, _, serve) = sorted(runner.agent_calls, key=lambda c: c[1])
    t = ts[0]
    assert (serve_host, serve["bind"]) == (t.b, t.b_ip)
    assert (send_host, send["bind"], send["to"]) == (t.a, t.a_ip, t.b_ip)
    assert serve["port"] == send["port"] and send["seconds"] == "0.5"
    assert "token" not in serve and "token" not in send   # on stdin, never in argv
    assert runner.stdins[0] == runner.stdins[1] and len(runner.stdins[0].strip()) == 32
    argv = measure.agent_argv("/opt/py3", "serve", bind=t.b_ip)
    assert argv[:2] == ["/opt/py3", "-c"] and "def serve(" in argv[2]


def test_a_taken_port_is_redrawn():
    ts = targets(Topology.from_recordings(TRI))[:1]
    runner = CheckRunner({(ts[0].a_ip, ts[0].b_ip): Link(taken=2)})
    [r] = run_check(runner, ts).results
    assert r.error is None
    ports = [o["port"] for _, role, o in runner.agent_calls if role == "serve"]
    assert len(ports) == 3
    runner = CheckRunner({(ts[0].a_ip, ts[0].b_ip): Link(taken=99)})
    [r] = run_check(runner, ts).results
    assert r.error == f"{ts[0].b}: no free port found for the receiver after 4 tries"


@pytest.mark.parametrize("link, expect", [
    (Link(send=CommandResult(255, "", "ssh to tri-1: connection refused (is sshd running there?)\n")),
     "tri-1: cannot reach it over ssh: ssh to tri-1: connection refused"),
    (Link(serve=CommandResult(127, "", "sh: 1: python3: not found\n")),
     "tri-2: 'python3' not found (sh: 1: python3: not found); name the remote Python with --measure-python "
     "(CheckOptions(python=...) in the widget)"),
    (Link(send=CommandResult(1, "", "cablecheck send: could not connect from A to B port 1 within 3 s\n")),
     "tri-1 (send on A): cablecheck send: could not connect"),
    (Link(send=CommandResult(0, "Traceback\n", "")), "tri-1 (send on A): the sender's last line is not JSON"),
])
def test_failures_name_the_host_and_cable(link, expect):
    [t] = targets(Topology.from_recordings(TRI))[:1]
    assert (t.a, t.b) == ("tri-1", "tri-2")
    [r] = run_check(CheckRunner({(t.a_ip, t.b_ip): link}), [t]).results
    assert r.error.startswith(expect.replace("on A", f"on {t.a_ip}"))
    assert r.line().startswith(f"{t.name} (nominal Thunderbolt 5, 80 Gb/s): FAILED: ")


def test_hung_cable_and_budget_are_bounded(monkeypatch):
    monkeypatch.setattr(measure, "GRACE", 0.2)
    ts = targets(Topology.from_recordings(TRI))  # three rounds of one cable
    hang = {(t.a_ip, t.b_ip): Link(hang=True) for t in ts}
    start = time.monotonic()
    rep = run_check(CheckRunner(hang), ts, cable_timeout=1.0, budget=2.5)
    took = time.monotonic() - start
    assert took < 10
    first, second, third = rep.results
    assert first.error == "no answer from tri-2 and tri-1 within 1 s"
    assert second.error.startswith("no answer from")
    assert third.error == "not measured: the check's time budget (2.5 s) ran out"


def test_progress_counts_every_cable():
    seen = []

    class P:
        def cable_done(self, result, done, total):
            seen.append((result.target.id, done, total))

    ts = targets(Topology.from_recordings(MESH))
    asyncio.run(check(CheckRunner({}), ts, CheckOptions(), P()))
    assert [d for _, d, _ in seen] == [1, 2, 3, 4, 5, 6] and {t for _, _, t in seen} == {6}
    assert sorted(i for i, _, _ in seen) == sorted(t.id for t in ts)


# -- mlx-jupyter config --measure --------------------------------------------------------------------


def cli(*args, links=None):
    runner = CheckRunner(links or {}, inner=FakeRunner(TRI))
    out, err = io.StringIO(), io.StringIO()
    code = configurator.main(["--hosts", "tri-1,tri-2,tri-3", "--auto-setup", *args], runner=runner, out=out, err=err)
    return code, out.getvalue(), err.getvalue(), runner


def test_cli_measure_reports_every_cable():
    code, out, err, runner = cli("--measure", "--measure-seconds", "0.3")
    assert code == 0, err
    report = out[out.index("Cable check\n"):].splitlines()
    assert len(report) == 2 + 3 + 1 and report[-1].startswith("3 cables checked in ")
    assert all("tri-1->tri-2" in ln or "tri-2->tri-3" in ln or "tri-3->tri-1" in ln for ln in report[2:5])
    assert "measuring 3 cables in 3 rounds (0.3 s each way" in err
    setup_done = max(i for i, (_, a) in enumerate(runner.calls) if a[:2] == ("sudo", "-n"))
    assert setup_done == len(runner.calls) - 1  # every setup command ran before the first agent (not in calls)
    assert {o["seconds"] for _, _, o in runner.agent_calls} == {"0.3"}


def test_cli_measure_flags_the_slow_cable_and_fails():
    t = targets(Topology.from_recordings(TRI))[1]
    code, out, err, _ = cli("--measure", "--measure-threshold", "0.45",
                            links={(t.a_ip, t.b_ip): Link(up_gbps=30.0, down_gbps=29.0)})
    assert code == 1
    flagged = [ln for ln in out.splitlines() if "<--" in ln]
    assert len(flagged) == 1 and flagged[0].startswith(t.name) and "under 45% of 80 Gb/s" in flagged[0]
    assert "3 cables checked" in out and "1 flagged, 0 failed" in out


@pytest.mark.parametrize("args, msg", [
    (["--measure", "--over", "ethernet"], "error: --measure checks the Thunderbolt cables of the plan; "
                                           "it does not go with --over ethernet"),
    (["--measure", "--measure-threshold", "0"], "error: --measure-threshold/--measure-asymmetry: the slow threshold"),
])
def test_cli_measure_refuses_bad_flags_before_any_ssh(args, msg):
    code, out, err, runner = cli(*args)
    assert code == 2 and err.startswith(msg) and runner.calls == []


@pytest.mark.parametrize("flag, value", [("--measure-budget", "-1"), ("--measure-timeout", "inf"),
                                         ("--measure-seconds", "nan")])
def test_cli_measure_seconds_are_checked_as_every_number_of_seconds(flag, value, capsys):
    """limits.seconds, as every entry point checks seconds (issue 31 §4): argparse names the flag."""
    code, out, err, runner = cli("--measure", flag, value)
    assert code == 2 and runner.calls == []
    assert f"argument {flag}: '{value}' must be a number of seconds above 0" in capsys.readouterr().err
