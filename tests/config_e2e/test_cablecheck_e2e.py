"""Cable check end to end on the namespace bed: real sshd hosts, veth "cables", one shaped slow with tc tbf.

(Also with that cable's sender pacing itself (the agent's --max-mbit), the way to slow it where tbf is missing.)

Each cable is a veth pair between two bed hosts with a /30 inside the bed's own subnet
(10.201.K.200 and up: the root namespace's guard route makes the subnet unreachable there).
The agents run over ssh with the hosts' python3, exactly as `mlx-jupyter config --measure` runs them.
"""

from __future__ import annotations

import asyncio
import shutil
import subprocess
import sys
import time

import pytest

from e2e_helpers import wait_until
from mlx_jupyter.configurator.measure import CheckOptions, check
from mlx_jupyter.configurator.runners import SSHRunner
from mlx_jupyter.topology.cablecheck import Target, Thresholds

SLOW_RATE = "50mbit"  # the shaped direction; the others run at whatever veth and Python give (Gb/s)
NOMINAL = 0.5  # Gb/s: flag under 0.25 (Python over veth does Gb/s even on a loaded machine)


def _ip(argv):
    res = subprocess.run(argv, capture_output=True, text=True, timeout=20)
    if res.returncode:
        raise RuntimeError(f"{' '.join(argv)}: {res.stderr.strip()}")
    return res


def tbf_available(bed) -> str | None:
    """Why tc tbf cannot shape a link in a bed host, or None."""
    if shutil.which("tc") is None:
        return "no tc (apt-get install iproute2)"
    ns = bed.ns(4)
    name = f"{bed.prefix}tq"
    try:
        _ip(["ip", "-n", ns, "link", "add", name, "type", "veth", "peer", "name", f"{bed.prefix}tr"])
    except RuntimeError as exc:
        return f"cannot add a veth pair: {exc}"
    try:
        res = subprocess.run(["tc", "-n", ns, "qdisc", "add", "dev", name, "root", "tbf", "rate", "1mbit",
                              "burst", "32kb", "latency", "50ms"], capture_output=True, text=True, timeout=20)
        return None if res.returncode == 0 else f"tc tbf unavailable: {res.stderr.strip()}"
    finally:
        subprocess.run(["ip", "-n", ns, "link", "del", name], capture_output=True, timeout=20)


@pytest.fixture
def cables(testbed):
    """Veth cables h1-h2, h2-h3, h3-h1 (Targets); removed afterwards."""
    made = []
    out = []
    try:
        for k, (i, j) in enumerate(((1, 2), (2, 3), (3, 1))):
            a, b = f"{testbed.prefix}c{k}a", f"{testbed.prefix}c{k}b"
            a_ip, b_ip = f"{testbed.net}.{201 + 4 * k}", f"{testbed.net}.{202 + 4 * k}"
            _ip(["ip", "link", "add", a, "netns", testbed.ns(i), "type", "veth", "peer", "name", b,
                 "netns", testbed.ns(j)])
            made.append((testbed.ns(i), a))
            for ns, dev, ip in ((testbed.ns(i), a, a_ip), (testbed.ns(j), b, b_ip)):
                _ip(["ip", "-n", ns, "addr", "add", f"{ip}/30", "dev", dev])
                _ip(["ip", "-n", ns, "link", "set", dev, "up"])
            out.append(Target(k, testbed.ips[i - 1], a_ip, testbed.ips[j - 1], b_ip, NOMINAL, f"h{i} {a} <-> h{j} {b}"))
        yield out
    finally:
        for ns, dev in made:
            subprocess.run(["ip", "-n", ns, "link", "del", dev], capture_output=True, timeout=20)


def python3() -> str:
    return "python3" if shutil.which("python3") else sys.executable


class PacedRunner(SSHRunner):
    """SSHRunner whose sender on one cable caps its rate at SLOW_RATE (the agent's --max-mbit)."""

    def __init__(self, paced: Target | None, **kw) -> None:
        super().__init__(**kw)
        self.paced = paced

    async def run(self, host, argv, stdin=""):
        argv = list(argv)
        if self.paced is not None and argv[3:4] == ["send"] and argv[argv.index("--bind") + 1] == self.paced.a_ip:
            argv += ["--max-mbit", SLOW_RATE.removesuffix("mbit")]
        return await super().run(host, argv, stdin)


def run(testbed, targets, paced: Target | None = None, **kw):
    async def go():
        runner = PacedRunner(paced, options=testbed.ssh_options(), command_timeout=60)
        try:
            return await check(runner, targets, CheckOptions(python=python3(), **kw))
        finally:
            await runner.close()

    return asyncio.run(go())


@pytest.mark.timeout(120)
@pytest.mark.parametrize("shaping", ["tbf", "paced"])
def test_the_shaped_link_is_flagged_and_the_others_are_not(testbed, cables, shaping):
    slow = None
    if shaping == "tbf" and tbf_available(testbed) is not None:
        pytest.skip(tbf_available(testbed))
    if shaping == "tbf":
        shaped_dev = cables[0].label.split()[1]  # h1's end of h1-h2
        _ip(["tc", "-n", testbed.ns(1), "qdisc", "add", "dev", shaped_dev, "root", "tbf", "rate", SLOW_RATE,
             "burst", "64kb", "latency", "100ms"])
    else:  # the fallback where the kernel has no tbf: h1's sender on that cable paces itself
        slow = cables[0]
    start = time.monotonic()
    rep = run(testbed, cables, seconds=0.5, cable_timeout=30, budget=90, thresholds=Thresholds(0.5, 4.0),
              paced=slow)
    assert time.monotonic() - start < 90
    print(rep.text())
    shaped, normal, other = rep.results
    assert all(r.error is None for r in rep.results), rep.text()
    # h1 -> h2 is held to 0.05 Gb/s; back the other way it is not
    assert shaped.a_to_b_gbps < 0.1 and shaped.b_to_a_gbps > 0.25, rep.text()
    assert [f.split(":")[0] for f in shaped.flags] == ["slow", "asymmetric"], rep.text()
    assert "h1 " in shaped.line() and "<--" in shaped.line()
    assert normal.ok and other.ok, rep.text()
    assert normal.a_to_b_gbps > 0.25 and normal.b_to_a_gbps > 0.25
    assert all(r.rtt_ms is not None and 0 < r.rtt_ms < 100 for r in rep.results)
    # the agents are gone from every host afterwards
    assert testbed.procs_matching("cablecheck") == {}


@pytest.mark.timeout(120)
def test_unreachable_host_and_missing_address_are_named(testbed, cables, tmp_path):
    shaped, normal, _ = cables
    gone = Target(7, f"{testbed.net}.99", normal.a_ip, normal.b, normal.b_ip, NOMINAL, "h9 en2 <-> h3 en3")
    # h1 holds no address of the h2-h3 cable: its receiver cannot listen there
    wrong = Target(8, normal.a, normal.a_ip, testbed.ips[0], normal.b_ip, NOMINAL, "h2 en2 <-> h1 en9")
    start = time.monotonic()
    rep = run(testbed, [gone, wrong], seconds=0.2, cable_timeout=15, budget=60)
    assert time.monotonic() - start < 60
    r_gone, r_wrong = rep.results
    assert r_gone.error.startswith(f"{testbed.net}.99: cannot reach it over ssh: ssh to {testbed.net}.99"), r_gone.error
    assert r_gone.line().startswith("h9 en2 <-> h3 en3 (nominal 0.5 Gb/s): FAILED: ")
    assert r_wrong.error == (f"{testbed.ips[0]} (serve on {normal.b_ip}): that address is not on {testbed.ips[0]} "
                             "yet: apply the setup first (Apply setup, or mlx-jupyter config --auto-setup)"), r_wrong.error
    # the ends left waiting were stopped by closing their ssh sessions, long before their own timeout (15 s)
    assert wait_until(lambda: testbed.procs_matching("cablecheck") == {}, 5), testbed.procs_matching("cablecheck")
