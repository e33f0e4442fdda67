"""`mlx-jupyter config` end to end over a fake runner serving the recorded clusters."""

from __future__ import annotations

import io
import json
import os
import sys

import pytest

from fake_runner import FakeRunner, as_run
from tb_fixtures import FIXTURES, SCENARIOS, expected
from mlx_jupyter import configurator
from mlx_jupyter.topology import CommandResult, Topology


class NoStdin:
    def read(self, *a):
        raise AssertionError("config read stdin")

    readline = read


@pytest.fixture(autouse=True)
def no_stdin(monkeypatch):
    monkeypatch.setattr(sys, "stdin", NoStdin())


def run(case: str, *args: str, runner: FakeRunner | None = None, hosts: list[str] | None = None):
    runner = runner or FakeRunner(FIXTURES / case)
    names = hosts or expected(case)["hosts"]
    out, err = io.StringIO(), io.StringIO()
    code = configurator.main(["--hosts", ",".join(names), *args], runner=runner, out=out, err=err)
    return code, out.getvalue(), err.getvalue(), runner


def hostfile_of(tmp_path, case, *args, **kw):
    path = tmp_path / "hostfile.json"
    code, out, err, runner = run(case, "--output-hostfile", str(path), *args, **kw)
    return code, (json.loads(path.read_text()) if path.exists() else None), err, runner


@pytest.mark.parametrize("case", SCENARIOS)
def test_auto_backend_writes_the_correct_hostfile(tmp_path, case):
    code, hostfile, err, runner = hostfile_of(tmp_path, case)
    auto = expected(case)["correct"]["auto"]
    assert code == 0, err
    assert hostfile == auto["hostfile"]
    assert f"backend: {auto['backend']}" in err
    assert runner.peak_hosts == len(expected(case)["hosts"])  # all hosts discovered at once


@pytest.mark.parametrize("case", SCENARIOS)
@pytest.mark.parametrize("backend", ["ring", "jaccl", "jaccl-ring"])
def test_named_backend(tmp_path, case, backend):
    code, hostfile, err, _ = hostfile_of(tmp_path, case, "--backend", backend)
    want = expected(case)["correct"][f"hostfile_{backend.replace('-', '_')}"]
    if want is None:
        assert code == 1 and hostfile is None and "error:" in err and "Traceback" not in err
    else:
        assert code == 0, err
        assert hostfile == want


@pytest.mark.parametrize("case", SCENARIOS)
def test_dot(case):
    code, out, _, runner = run(case, "--dot")
    assert code == 0
    assert out == Topology.from_recordings(FIXTURES / case).to_dot()
    assert not any(h for h, a in runner.calls if "ifconfig" in a)


def test_printed_setup_never_waits_and_touches_nothing():
    code, out, err, runner = run("four-macs-ring-only")
    assert code == 0
    assert all(not runner.setup_calls(h) for h in expected("four-macs-ring-only")["hosts"])
    for host, lines in expected("four-macs-ring-only")["correct"]["setup_commands"].items():
        assert f"Setup for {host}" in out
        assert "\n".join(lines) in out
    assert "Hostfile" in out


def test_auto_setup_is_all_or_none_as_mlx():
    """mini-c lacks passwordless sudo: no host is set up, every host's commands are printed."""
    code, out, err, runner = run("four-macs-ring-only", "--auto-setup")
    assert code == 0, err
    correct = expected("four-macs-ring-only")["correct"]["setup_commands"]
    for host in ("mini-a", "mini-b", "mini-c", "mini-d"):
        assert runner.setup_calls(host) == []
        assert "\n".join(correct[host]) in out
    assert "Setup for mini-c (no passwordless sudo: mini-c lack(s) passwordless sudo" in out
    assert "Setup for mini-a (mini-c lack(s) passwordless sudo, so no host was set up" in out
    assert "--partial-setup" in out


def test_partial_setup_runs_where_sudo_works_and_prints_the_rest():
    code, out, err, runner = run("four-macs-ring-only", "--auto-setup", "--partial-setup")
    assert code == 0, err
    correct = expected("four-macs-ring-only")["correct"]["setup_commands"]
    for host in ("mini-a", "mini-b", "mini-d"):
        assert runner.setup_calls(host) == as_run(correct[host])
        assert f"Setup for {host}" not in out
    assert runner.setup_calls("mini-c") == []
    assert "Setup for mini-c (no passwordless sudo" in out
    assert "\n".join(correct["mini-c"]) in out


def test_auto_setup_failure_is_reported_per_host(tmp_path):
    runner = FakeRunner(FIXTURES / "two-macs-one-cable", answers={
        ("mini-2", ("sudo", "-n", "ifconfig", "en2", "inet", "192.168.0.2", "netmask", "255.255.255.252")):
            CommandResult(1, "", "ifconfig: ioctl (SIOCAIFADDR): Invalid argument\n"),
        ("mini-1", ("sudo", "-n", "ifconfig", "bridge0", "down")):
            CommandResult(1, "", "ifconfig: interface bridge0 does not exist\n"),
    })
    code, hostfile, err, _ = hostfile_of(tmp_path, "two-macs-one-cable", "--auto-setup", runner=runner)
    assert code == 1
    assert "setup failed on mini-2" in err and "SIOCAIFADDR" in err
    assert "mini-1" not in err.split("setup failed")[1]  # a missing bridge0 is not a failure
    assert hostfile is not None


# Every malformed recording through the CLI: (extra flags, exit code, what stderr must carry).
# "error" = exactly one `error:` line naming the host and the command; "warning" = a documented
# warning and a hostfile; "reason" = the backend line says why RDMA was not used; "quiet" = harmless.
MALFORMED_RUNS = [
    ("empty-system-profiler", [], 1, "error"),
    ("not-json-ssh-error", [], 1, "error"),
    ("not-json-sudo-error", [], 1, "error"),
    ("truncated-json", [], 1, "error"),
    ("missing-spthunderboltdatatype", [], 1, "error"),
    ("empty-bus-list", [], 1, "error"),
    ("networksetup-empty", [], 1, "error"),
    ("networksetup-no-thunderbolt-ports", [], 1, "error"),
    ("ssh-unreachable", [], 1, "error"),
    ("bus-without-receptacle-tag", [], 0, "warning"),
    ("bus-without-device-name", [], 0, "quiet"),
    ("ibv-devices-not-found", [], 0, "reason"),
    ("ibv-devices-not-found", ["--backend", "jaccl"], 1, "error"),
    ("no-ip-address", [], 0, "reason"),
    ("no-ip-address", ["--backend", "jaccl"], 1, "error"),
    ("no-ip-address", ["--backend", "jaccl-ring"], 1, "error"),
]


def test_every_malformed_case_is_run():
    from tb_fixtures import MALFORMED

    assert sorted({case for case, *_ in MALFORMED_RUNS}) == MALFORMED


@pytest.mark.parametrize("case, extra, code, kind", MALFORMED_RUNS)
def test_malformed_case_through_the_cli(tmp_path, case, extra, code, kind):
    want = expected(f"malformed/{case}")
    got, hostfile, err, runner = hostfile_of(tmp_path, f"malformed/{case}", *extra)
    assert got == code, err
    assert "Traceback" not in err and "Exception" not in err
    assert err.count("error:") == (1 if kind == "error" else 0), err
    if kind == "quiet":
        assert "warning:" not in err and hostfile is not None
        return
    start = {"error": "error:", "warning": "warning:", "reason": "backend:"}[kind]
    assert err.count(start) == 1, err
    message = err[err.index(start):]  # an error may go on for a few lines (a list of hosts)
    message = message if kind == "error" else message.splitlines()[0]
    for word in want["must_mention"]:
        assert word in message, (word, err)
    assert (hostfile is None) == (kind == "error")
    if hostfile is not None:  # whatever was written is usable: rank 0 has its address when jaccl needs it
        assert hostfile["backend"] == "ring" or all(h["ips"] for h in hostfile["hosts"])


def test_ignore_unreachable_leaves_the_host_out():
    code, _, err, _ = run("malformed/ssh-unreachable", "--ignore-unreachable")
    assert "leaving out unreachable hosts" in err and "mac-2" in err
    assert code == 1 and "at least two hosts" in err


def test_env_is_saved_and_bad_keys_skipped(tmp_path):
    code, hostfile, err, _ = hostfile_of(tmp_path, "two-macs-one-cable", "--env", "MLX_METAL_FAST_SYNCH=1",
                                         "--env", "BAD-KEY=1")
    assert code == 0
    assert hostfile["envs"] == ["MLX_METAL_FAST_SYNCH=1"]
    assert "BAD-KEY" in err


def test_hostfile_input(tmp_path):
    src = tmp_path / "in.json"
    src.write_text(json.dumps([{"ssh": "mini-1"}, {"ssh": "mini-2"}]))
    out, err = io.StringIO(), io.StringIO()
    code = configurator.main(["--hostfile", str(src)], runner=FakeRunner(FIXTURES / "two-macs-one-cable"), out=out, err=err)
    assert code == 0, err
    assert '"192.168.0.1"' in out.getvalue()


def test_hostfile_input_with_fields_mlx_ignores(tmp_path):
    """Issue 35 §1: a host's "comment" and a top-level "note" are ignored with one warning naming them."""
    src = tmp_path / "in.json"
    src.write_text(json.dumps({"note": "rack 3", "hosts": [{"ssh": "mini-1", "comment": "left"}, {"ssh": "mini-2"}]}))
    out, err = io.StringIO(), io.StringIO()
    code = configurator.main(["--hostfile", str(src)], runner=FakeRunner(FIXTURES / "two-macs-one-cable"), out=out, err=err)
    assert code == 0, err.getvalue()
    assert '"192.168.0.1"' in out.getvalue()
    warnings = [line for line in err.getvalue().splitlines() if "unknown field" in line]
    assert warnings == [f"warning: hostfile {str(src)!r}: ignored unknown field(s) 'note' (top level), 'comment' "
                        "(host 0), as MLX ignores them (a hostfile's fields: backend, envs, hosts; a host's: ssh, "
                        "ips, rdma)"], err.getvalue()


@pytest.mark.parametrize("kind, message", [
    ("deep", "not a hostfile (nested deeper than 32 levels)"),
    ("fifo", "is not a regular file"),
    ("typo", "unknown field 'hots': did you mean 'hosts'?"),
])
def test_a_hostile_hostfile_is_one_error_line(tmp_path, kind, message):
    """Issue 31 §4: was a RecursionError traceback (deep) or a hang for good (a FIFO nobody writes)."""
    src = tmp_path / "in.json"
    if kind == "fifo":
        os.mkfifo(src)
    else:
        src.write_text("[" * 100000 if kind == "deep" else json.dumps({"hots": [{"ssh": "mini-1"}]}))
    out, err = io.StringIO(), io.StringIO()
    code = configurator.main(["--hostfile", str(src)], runner=FakeRunner(FIXTURES / "two-macs-one-cable"), out=out, err=err)
    assert code == 1
    assert err.getvalue().startswith(f"error: hostfile {str(src)!r}") and message in err.getvalue(), err.getvalue()
    assert len(err.getvalue().splitlines()) == 1


def test_usage_errors_exit_2(capsys):
    assert configurator.main([], runner=FakeRunner(None)) == 2
    assert configurator.main(["--hosts", "a", "--over", "wifi"], runner=FakeRunner(None)) == 2
    assert configurator.main(["--hosts", "a,,b"], runner=FakeRunner(None), err=io.StringIO()) == 1


def test_same_mac_twice_is_refused(tmp_path):
    import shutil

    shutil.copytree(FIXTURES / "two-macs-one-cable", tmp_path / "c")
    shutil.copytree(FIXTURES / "two-macs-one-cable" / "mini-1", tmp_path / "c" / "mini-1.local")
    code, _, err, _ = run("x", runner=FakeRunner(tmp_path / "c"), hosts=["mini-1", "mini-2", "mini-1.local"])
    assert code == 1 and "same machine" in err


# -- ethernet ---------------------------------------------------------------------------------------


def test_ethernet_refuses_jaccl():
    code, _, err, _ = run("two-macs-one-cable", "--over", "ethernet", "--backend", "jaccl")
    assert code == 2 and "thunderbolt" in err


def test_ethernet_without_address_names_host_and_command():
    code, _, err, _ = run("malformed/no-ip-address", "--over", "ethernet")
    assert code == 1 and "mac-1" in err and "ipconfig getifaddr" in err


def test_ssh_flags_become_ssh_options():
    args = configurator.parser().parse_args(["--hosts", "a,b", "--ssh-config", "c1", "--ssh-config", "c2", "--known-hosts",
                                       "kh", "-i", "k1", "--connect-timeout", "2.5", "--accept-unknown-hosts"])
    opts = configurator.ssh_options(args)
    assert (opts.config, opts.known_hosts, opts.client_keys, opts.connect_timeout, opts.accept_unknown_hosts) == (
        ["c1", "c2"], "kh", ["k1"], 2.5, True)
    default = configurator.ssh_options(configurator.parser().parse_args(["--hosts", "a,b"]))
    assert (default.config, default.known_hosts, default.client_keys, default.connect_timeout) == (
        None, None, None, configurator.CONNECT_TIMEOUT)


# -- progress, --verbose, --no-auto-setup, no stdin at all ----------------------------------------


class TTY(io.StringIO):
    """A stderr that says it is a terminal."""

    def isatty(self) -> bool:
        return True


def run_to(err: io.StringIO, case: str, *args: str, hosts: list[str] | None = None) -> tuple[int, str]:
    names = hosts or expected(case)["hosts"]
    out = io.StringIO()
    code = configurator.main(["--hosts", ",".join(names), *args], runner=FakeRunner(FIXTURES / case), out=out, err=err)
    return code, out.getvalue()


def test_progress_counts_hosts_on_a_terminal():
    err = TTY()
    code, _ = run_to(err, "four-m3-ultra-mesh")
    assert code == 0
    text = err.getvalue()
    counts = [line for line in text.split("\r") if line.startswith("discovering:")]
    assert [c.split("\n")[0] for c in counts] == [f"discovering: {k}/4 hosts" for k in range(1, 5)]
    assert "discovering: 4/4 hosts\nbackend: jaccl" in text  # the line is ended before anything else


def test_no_progress_when_not_a_terminal():
    err = io.StringIO()
    assert run_to(err, "four-m3-ultra-mesh")[0] == 0
    assert "discovering" not in err.getvalue() and "\r" not in err.getvalue()
    assert "[config]" not in err.getvalue()


@pytest.mark.parametrize("stream", [io.StringIO, TTY])
def test_verbose_logs_each_host_with_its_outcome(stream):
    err = stream()
    code, _ = run_to(err, "malformed/ssh-unreachable", "--verbose", "--ignore-unreachable")
    assert code == 1  # one host left: not a cluster
    lines = [line for line in err.getvalue().splitlines() if line.startswith("[config]")]
    assert sorted(line.split(" after ")[0] for line in lines) == ["[config] mac-1: done", "[config] mac-2: FAILED"]
    assert all(line.endswith(" s") for line in lines)
    assert "\r" not in err.getvalue()  # --verbose replaces the self-rewriting line


@pytest.mark.parametrize("flags", [["--no-auto-setup"], ["--auto-setup", "--no-auto-setup"], []])
def test_no_auto_setup_prints_and_runs_nothing(flags):
    runner = FakeRunner(FIXTURES / "two-macs-one-cable")
    code, out, err, runner = run("two-macs-one-cable", *flags, runner=runner)
    assert code == 0, err
    assert all(runner.setup_calls(h) == [] for h in ("mini-1", "mini-2"))
    setup = expected("two-macs-one-cable")["correct"]["setup_commands"]
    for host, lines in setup.items():
        assert f"Setup for {host} (run these, or pass --auto-setup)\n" in out
        assert "\n".join(lines) in out
    assert "setting up" not in err


def test_runs_with_file_descriptor_0_closed(tmp_path):
    """Not /dev/null: no fd 0 at all (sys.stdin is None), as under some schedulers and notebooks."""
    import subprocess

    case = FIXTURES / "four-macs-ring-only"
    out = tmp_path / "hostfile.json"
    driver = (
        "import sys; sys.path.insert(0, sys.argv[1]); from fake_runner import FakeRunner; "
        "from mlx_jupyter import configurator; assert sys.stdin is None; "
        "sys.exit(configurator.main(['--hosts', 'mini-a,mini-b,mini-c,mini-d', '--auto-setup', '--partial-setup', "
        "'--output-hostfile', sys.argv[3]], runner=FakeRunner(sys.argv[2])))"
    )
    here = str(FIXTURES.parent.parent / "topology")
    res = subprocess.run(["sh", "-c", 'exec "$@" 0<&-', "sh", sys.executable, "-c", driver, here, str(case), str(out)],
                         capture_output=True, text=True, timeout=60)
    assert res.returncode == 0, res.stderr
    assert "Traceback" not in res.stderr and "setting up mini-a, mini-b, mini-d over ssh" in res.stderr
    assert json.loads(out.read_text()) == expected("four-macs-ring-only")["correct"]["auto"]["hostfile"]
