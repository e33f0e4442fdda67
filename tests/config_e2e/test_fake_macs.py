"""`mlx-jupyter config --over thunderbolt` end to end over real ssh, against fake Macs on the test bed.

Each recorded cluster is served by the bed's sshd hosts (see fake_macs.py);
the ssh names of the recording reach them through an ssh config written here.
"""

from __future__ import annotations

import json
import os
import subprocess
from collections import Counter
from pathlib import Path

import pytest

from e2e_helpers import FIXTURES, PY, mlx_jupyter, wait_until
from fake_macs import openssh_wrapper

pytestmark = pytest.mark.timeout(120)

#: What every reachable Mac is sent by discovery, whatever the case (order is free: commands run concurrently).
DISCOVERY = Counter([
    ("sudo", "-n", "true"),
    ("system_profiler", "SPThunderboltDataType", "-json"),
    ("networksetup", "-listallhardwareports"),
    ("ibv_devices",),
    ("ipconfig", "getifaddr", "en0"),
    ("ipconfig", "getifaddr", "en1"),
])


def expected(case: str) -> dict:
    return json.loads((FIXTURES / case / "expected.json").read_text())


def small_scenarios(limit: int = 4) -> list[str]:
    return sorted(p.parent.name for p in FIXTURES.glob("*/expected.json") if len(expected(p.parent.name)["hosts"]) <= limit)


def accepted(bed, i: int) -> int:
    """ssh logins sshd of host i has logged so far."""
    return (bed.root / f"h{i}" / "sshd.log").read_text(errors="replace").count("Accepted publickey")


def config(cluster, tmp_path: Path, *args: str, no_fd0: bool = False):
    """Run the CLI on the cluster's hosts with its ssh config; returns (result, hostfile or None)."""
    cfg = cluster.ssh_config(tmp_path / "ssh_config")
    out = tmp_path / "hostfile.json"
    res = mlx_jupyter(["config", "--hosts", ",".join(cluster.names), "--over", "thunderbolt", "--ssh-config",
                       str(cfg), "--output-hostfile", str(out), *args], no_fd0=no_fd0)
    return res, (json.loads(out.read_text()) if out.exists() else None)


@pytest.mark.parametrize("case", small_scenarios())
def test_auto_setup_sends_each_host_exactly_its_commands(testbed, fake_cluster, tmp_path, case):
    cluster = fake_cluster(case)
    before = {m.index: accepted(testbed, m.index) for m in cluster.macs.values()}
    res, hostfile = config(cluster, tmp_path, "--auto-setup", "--partial-setup")
    want = expected(case)["correct"]
    assert res.returncode == 0, res.stderr
    assert "Traceback" not in res.stderr
    assert hostfile == want["auto"]["hostfile"]
    for name, mac in cluster.macs.items():
        lines = want["setup_commands"][name]
        sudo = json.loads((FIXTURES / case / name / "host.json").read_text()).get("sudo", True)
        sent = Counter(mac.received())
        run = [("sudo", "-n", *line.split()[1:]) for line in lines]  # auto-setup never lets sudo prompt
        setup = Counter(run) if sudo else Counter()
        applied = Counter(a[2:] for a in setup)  # what got past sudo to ifconfig/route
        assert sent == DISCOVERY + setup + applied, name
        assert mac.sent_setup() == ([" ".join(a) for a in run] if sudo else []), name  # in order
        assert mac.configured() == ([line.removeprefix("sudo ") for line in lines] if sudo else []), name
        printed = f"Setup for {name} (no passwordless sudo" in res.stdout
        assert printed == (not sudo), name
        if not sudo:
            assert "\n".join(lines) in res.stdout
    # one ssh connection per host for all of its commands
    assert wait_until(lambda: all(accepted(testbed, i) >= n + 1 for i, n in before.items()), 5)
    assert {i: accepted(testbed, i) - n for i, n in before.items()} == {i: 1 for i in before}


def test_auto_setup_over_ssh_with_fd0_closed(fake_cluster, tmp_path):
    """No stdin at all (fd 0 closed, not /dev/null): discovery and setup still run, nothing prompts."""
    case = "four-macs-ring-only"  # mini-c has no passwordless sudo: its commands are printed
    cluster = fake_cluster(case)
    res, hostfile = config(cluster, tmp_path, "--auto-setup", "--partial-setup", no_fd0=True)
    assert res.returncode == 0, res.stderr
    assert "Traceback" not in res.stderr
    want = expected(case)["correct"]
    assert hostfile == want["auto"]["hostfile"]
    for name, mac in cluster.macs.items():
        sudo = name != "mini-c"
        assert mac.configured() == ([line.removeprefix("sudo ") for line in want["setup_commands"][name]]
                                    if sudo else []), name
    assert "Setup for mini-c (no passwordless sudo" in res.stdout


def test_without_auto_setup_nothing_is_run(fake_cluster, tmp_path):
    case = "four-m3-ultra-mesh"
    cluster = fake_cluster(case)
    res, hostfile = config(cluster, tmp_path)
    assert res.returncode == 0, res.stderr
    assert hostfile == expected(case)["correct"]["auto"]["hostfile"]
    for name, mac in cluster.macs.items():
        assert Counter(mac.received()) == DISCOVERY
        assert f"Setup for {name} (run these, or pass --auto-setup)" in res.stdout
        assert "\n".join(expected(case)["correct"]["setup_commands"][name]) in res.stdout


def test_a_failing_setup_command_is_reported_with_its_host(fake_cluster, tmp_path):
    cluster = fake_cluster("two-macs-one-cable")
    ifconfig = cluster.bed.host_bin(cluster.macs["mini-2"].index) / "ifconfig"
    ifconfig.unlink()  # mini-2's ifconfig now refuses everything
    ifconfig.write_text('#!/bin/sh\necho "ifconfig: ioctl (SIOCAIFADDR): File exists" >&2\nexit 1\n')
    ifconfig.chmod(0o755)
    res, hostfile = config(cluster, tmp_path, "--auto-setup")
    assert res.returncode == 1
    assert "setup failed on mini-2" in res.stderr and "SIOCAIFADDR" in res.stderr
    assert "en2 inet 192.168.0.2" in res.stderr and "bridge0" not in res.stderr  # a missing bridge is fine
    assert "setup failed on mini-1" not in res.stderr
    assert len(cluster.macs["mini-1"].configured()) == 3
    assert hostfile == expected("two-macs-one-cable")["correct"]["auto"]["hostfile"]


@pytest.mark.parametrize("case, extra, words", [
    ("malformed/truncated-json", [], ["mac-2", "system_profiler"]),
    ("malformed/not-json-sudo-error", [], ["mac-2", "system_profiler"]),
    ("malformed/networksetup-empty", [], ["mac-2", "networksetup"]),
    ("malformed/ibv-devices-not-found", ["--backend", "jaccl"], ["mac-2", "ibv_devices"]),
    ("malformed/ssh-unreachable", [], ["mac-2", "ssh"]),
    ("malformed/ssh-unreachable", ["--ignore-unreachable"], ["mac-2", "leaving out", "at least two hosts"]),
])
def test_malformed_answers_over_ssh_give_one_clear_error(fake_cluster, tmp_path, case, extra, words):
    cluster = fake_cluster(case)
    res, hostfile = config(cluster, tmp_path, "--auto-setup", *extra)
    assert res.returncode == 1 and hostfile is None
    assert "Traceback" not in res.stderr and res.stderr.count("error:") == 1, res.stderr
    for word in words:
        assert word in res.stderr
    for mac in cluster.macs.values():
        assert mac.sent_setup() == [] and mac.configured() == []


@pytest.mark.parametrize("case", ["two-macs-one-cable", "four-macs-broken-mesh"])
def test_mlx_configurator_on_the_fakes_matches_its_recorded_run(fake_cluster, tmp_path, case):
    """The fakes are faithful: MLX's own configurator, over OpenSSH, does what the recordings say it does."""
    mlx_config = Path(PY).parent / "mlx.distributed_config"
    if not mlx_config.exists():
        pytest.skip("mlx.distributed_config is not installed")
    cluster = fake_cluster(case)
    openssh_wrapper(tmp_path / "bin", cluster.ssh_config(tmp_path / "ssh_config"))
    run = expected(case)["mlx"]["runs"]["auto"]
    argv = [a.replace("HOSTFILE.json", str(tmp_path / "mlx.json")) for a in run["argv"]]
    res = subprocess.run([str(mlx_config), *argv], stdin=subprocess.DEVNULL, capture_output=True, text=True,
                         timeout=60, env={**os.environ, "PATH": f"{tmp_path / 'bin'}:{os.environ['PATH']}"})
    assert (res.returncode, res.stdout) == (run["exit_code"], run["stdout"]), res.stderr
    assert json.loads((tmp_path / "mlx.json").read_text()) == run["hostfile"]
    for name, lines in run["remote_setup_commands"].items():
        assert [" ; ".join(cluster.macs[name].sent_setup())] == lines


def test_names_outside_the_recording_dial_nothing_outside_the_bed(fake_cluster, tmp_path):
    cluster = fake_cluster("two-macs-one-cable")
    cfg = cluster.ssh_config(tmp_path / "ssh_config")
    res = mlx_jupyter(["config", "--hosts", "mini-1,mini-2,10.0.0.41,stranger", "--ssh-config", str(cfg)])
    assert res.returncode == 1
    assert "10.0.0.41: ssh to 10.0.0.41: connection refused" in res.stderr  # h1's closed port, not 10.0.0.41
    assert "stranger: ssh to stranger: connection refused" in res.stderr
