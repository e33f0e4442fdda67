"""Names from remote output (networksetup devices, system_profiler fields) never reach a command unchecked.

Setup commands are planned as argv lists; the printed `sudo ...` lines are their quoted form,
and auto-setup runs the argv itself (`sudo -n`), never text split on spaces.
"""

from __future__ import annotations

import asyncio
import io
import json
import re
import shlex

import pytest
from hypothesis import given, settings, strategies as st

from fake_runner import FakeRunner
from tb_fixtures import FIXTURES
from mlx_jupyter import configurator
from mlx_jupyter.topology import CommandResult, DiscoveryError, End, MacHost, Peer, PlanError, Port, Topology
from mlx_jupyter.topology.addressing import SetupLine
from mlx_jupyter.topology.commands import NETWORKSETUP, SYSTEM_PROFILER
from mlx_jupyter.topology.recordings import DISCOVERY, Recording

CASE = FIXTURES / "two-macs-one-cable"  # mini-1 en3 <-> mini-2 en2 (Thunderbolt 1 = en2 on mini-2)
settings.register_profile("names", max_examples=150, deadline=None)
INTERFACE = re.compile(r"[a-z]{1,12}[0-9]{1,4}")


def outputs(**override: CommandResult) -> dict:
    """The case's recorded outputs, with mini-2's replaced as given (keyword = file stem)."""
    rec = Recording(CASE)
    out = {h: {cmd: rec.answer(h, cmd) for cmd in DISCOVERY} for h in rec.hosts()}
    keys = {"networksetup": NETWORKSETUP, "system_profiler": SYSTEM_PROFILER}
    for stem, result in override.items():
        out["mini-2"][keys[stem]] = result
    return out


def networksetup_with(device: str) -> CommandResult:
    text = (CASE / "mini-2" / "networksetup.txt").read_text()
    return CommandResult(0, text.replace("Hardware Port: Thunderbolt 1\nDevice: en2\n",
                                         f"Hardware Port: Thunderbolt 1\nDevice: {device}\n"))


def profiler_with(edit) -> CommandResult:
    data = json.loads((CASE / "mini-2" / "system_profiler.json").read_text())
    edit(data["SPThunderboltDataType"])
    return CommandResult(0, json.dumps(data))


def bus(buses: list, name: str) -> dict:
    return next(b for b in buses if b["_name"] == name)


@pytest.mark.parametrize("device", ["en2; rm -rf ~", "en2 alias", "$(reboot)", "en2\x1b[2J", "EN2", "en", "../en2",
                                    "en2-", "bridge0`id`"])
def test_malformed_device_is_refused_naming_host_command_and_value(device):
    with pytest.raises(DiscoveryError) as info:
        Topology.from_outputs(["mini-1", "mini-2"], outputs(networksetup=networksetup_with(device)))
    exc = info.value
    assert (exc.host, exc.command) == ("mini-2", "networksetup -listallhardwareports")
    assert repr(device) in str(exc) and "Thunderbolt 1" in str(exc)
    assert "\x1b" not in str(exc)  # quoted with repr: no raw escape reaches the terminal


def test_malformed_device_through_the_cli_sends_no_setup(tmp_path):
    runner = FakeRunner(CASE, answers={("mini-2", NETWORKSETUP): networksetup_with("en2;reboot")})
    out, err = io.StringIO(), io.StringIO()
    code = configurator.main(["--hosts", "mini-1,mini-2", "--auto-setup"], runner=runner, out=out, err=err)
    assert code == 1 and err.getvalue().count("error:") == 1
    assert "mini-2: `networksetup -listallhardwareports` gives Thunderbolt 1 the device 'en2;reboot'" in err.getvalue()
    assert runner.setup_calls("mini-1") == runner.setup_calls("mini-2") == []
    assert "Setup for" not in out.getvalue()


@settings(settings.get_profile("names"))
@given(st.text(st.characters(blacklist_categories=("Cs",), blacklist_characters="\r\n\x0b\x0c\x1c\x1d\x1e\x85\u2028\u2029"),
               min_size=1, max_size=20).map(str.strip).filter(bool))
def test_any_device_text_is_either_an_interface_or_refused(device):
    try:
        topo = Topology.from_outputs(["mini-1", "mini-2"], outputs(networksetup=networksetup_with(device)))
    except DiscoveryError as exc:
        assert not INTERFACE.fullmatch(device)
        assert exc.host == "mini-2" and exc.command == "networksetup -listallhardwareports"
        return
    assert INTERFACE.fullmatch(device)
    assert topo.hosts[1].port(device).iface == device
    assert topo.setup_commands()["mini-2"][1] == f"sudo ifconfig {device} inet 192.168.0.2 netmask 255.255.255.252"


@pytest.mark.parametrize("rid", ["1; reboot", "x", "-1", "²", True])
def test_receptacle_must_be_a_number(rid):
    def edit(buses):
        bus(buses, "thunderboltusb4_bus_0")["receptacle_1_tag"]["receptacle_id_key"] = rid

    with pytest.raises(DiscoveryError) as info:
        Topology.from_outputs(["mini-1", "mini-2"], outputs(system_profiler=profiler_with(edit)))
    assert info.value.host == "mini-2" and info.value.command == "system_profiler SPThunderboltDataType -json"
    assert "not a number" in str(info.value) or "no receptacle_1_tag.receptacle_id_key" in str(info.value)


def test_control_characters_in_peer_names_are_neutralised():
    def edit(buses):
        peer = bus(buses, "thunderboltusb4_bus_0")["_items"][0]
        peer["domain_uuid_key"] = "FOREIGN-UUID"
        peer["_name"] = "Evil\x1b]0;pwned\x07 Mac"
        peer["device_name_key"] = "Mac\r\n99,1"

    topo = Topology.from_outputs(["mini-1", "mini-2"], outputs(system_profiler=profiler_with(edit)))
    texts = topo.warnings + [topo.to_dot(), topo.to_svg()]
    assert any("Evil?]0;pwned? Mac" in w for w in topo.warnings), topo.warnings
    assert all("\x1b" not in t and "\x07" not in t and "\r" not in t for t in texts)


def test_setup_lines_keep_their_argv_and_quote_it():
    topo = Topology.from_recordings(FIXTURES / "four-m3-ultra-mesh")
    for lines in topo.setup_commands().values():
        for line in lines:
            assert isinstance(line, SetupLine)
            assert shlex.split(line) == ["sudo", *line.argv]
            assert line.argv[0] in ("ifconfig", "route")


def test_apply_setup_refuses_text_and_other_programs():
    runner = FakeRunner(CASE)
    for bad in ("sudo ifconfig en2 inet 192.168.0.1 netmask 255.255.255.252", ["rm", "-rf", "/"], []):
        with pytest.raises((TypeError, ValueError)):
            asyncio.run(configurator.apply_setup(runner, {"mini-1": [bad]}))
    assert runner.calls == []  # refused before anything ran


def test_auto_setup_sends_argv_with_sudo_n():
    runner = FakeRunner(CASE)
    topo = Topology.from_recordings(CASE)
    failures = asyncio.run(configurator.apply_setup(runner, topo.setup_commands()))
    assert failures == {}
    sent = [a for h, a in runner.calls if h == "mini-2"]
    assert sent == [("sudo", "-n", "ifconfig", "bridge0", "down"),
                    ("sudo", "-n", "ifconfig", "en2", "inet", "192.168.0.2", "netmask", "255.255.255.252"),
                    ("sudo", "-n", "route", "change", "192.168.0.1", "-interface", "en2")]


def test_a_hand_built_topology_with_a_bad_interface_plans_nothing():
    a = MacHost("a", (Port("en2 ; reboot", "UA", link_gbps=80.0, peer=Peer("UB")),))
    b = MacHost("b", (Port("en2", "UB", link_gbps=80.0, peer=None),))
    topo = Topology([a, b])
    assert topo.local_cables[0].a == End(0, "en2 ; reboot")
    with pytest.raises(PlanError, match="a: interface name 'en2 ; reboot'"):
        topo.setup_commands()
