"""Recorded command outputs (a folder per host, as in tests/fixtures/thunderbolt) served as answers.

The only module of the package that reads files. A case's ``cablecheck.json`` answers the cable
check's agent (``config/measure_agent.py``) per cable; as on real Macs, an end can bind its cable
address only once the setup has given it to the host.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Any, Sequence

from .commands import (
    IBV_DEVICES, NETWORKSETUP, PROBE, SUDO_PROBE, SYSTEM_PROFILER, UNAME, THUNDERBOLT_DISCOVERY, CommandResult, getifaddr,
)
from .errors import DiscoveryError

if TYPE_CHECKING:
    from .discover import Outputs

CABLE_CHECK = "cablecheck.json"
AGENT_ROLES = ("serve", "send")
FILES = {
    SYSTEM_PROFILER: "system_profiler.json",
    NETWORKSETUP: "networksetup.txt",
    IBV_DEVICES: "ibv_devices.txt",
    getifaddr("en0"): "en0.txt",
    getifaddr("en1"): "en1.txt",
}
DISCOVERY = THUNDERBOLT_DISCOVERY
_SUDO_REFUSED = "sudo: a password is required\n"


class RecordingsNotFound(FileNotFoundError):
    """No recorded cluster at the folder given; the message says where the examples are."""


def examples_folder() -> Path | None:
    """The recorded examples of the source checkout this package runs from (tests/fixtures/thunderbolt), if any."""
    folder = Path(__file__).resolve().parents[2] / "tests" / "fixtures" / "thunderbolt"
    return folder if folder.is_dir() else None


def missing_folder(folder: Path) -> RecordingsNotFound:
    """The error for a folder that is not there: the path it meant from here, and the examples' own."""
    examples = examples_folder()
    where = f"{folder} (from {Path.cwd()})" if not folder.is_absolute() else str(folder)
    if examples is None:
        hint = ("the recorded examples are in an mlx_jupyter source checkout's tests/fixtures/thunderbolt/; "
                "give the path of one case folder there")
    else:
        cases = sorted(p.name for p in examples.iterdir() if p.is_dir() and not p.name.startswith(("_", ".")))
        example = examples / (folder.name if (examples / folder.name).is_dir() else cases[0])
        hint = (f"the recorded examples are in {examples} ({', '.join(cases)}): give one by its full path, "
                f"e.g. Topology.from_recordings({str(example)!r})")
    return RecordingsNotFound(f"no recorded cluster at {where}: {hint}")


class Recording:
    """One recorded cluster: answers a host's command from its folder, like that Mac would."""

    def __init__(self, folder: str | Path) -> None:
        self.folder = Path(folder)
        if not self.folder.is_dir():
            raise missing_folder(self.folder)
        self.addresses: dict[str, set[str]] = {}   # host -> addresses its setup commands gave it

    def hosts(self) -> list[str]:
        """The host list of hosts.txt (in order), else the host folders (sorted)."""
        listing = self.folder / "hosts.txt"
        if listing.exists():
            return [line.strip() for line in listing.read_text().splitlines() if line.strip()]
        return sorted(p.name for p in self.folder.iterdir() if p.is_dir())

    def meta(self, host: str) -> dict[str, Any]:
        """host.json with its defaults: reachable, passwordless sudo, exit 0."""
        meta: dict[str, Any] = {"ssh": True, "sudo": True, "exit_codes": {}, "stderr": {}}
        path = self.folder / host / "host.json"
        if path.exists():
            meta.update(json.loads(path.read_text()))
        return meta

    def answer(self, host: str, argv: Sequence[str]) -> CommandResult:
        """What `host` prints for `argv` (unknown host: ssh's resolve error, exit 255)."""
        hdir = self.folder / host
        if not hdir.is_dir():
            return CommandResult(255, "", f"ssh: Could not resolve hostname {host}\n")
        meta = self.meta(host)
        if not meta["ssh"]:
            return CommandResult(255, "", f"ssh: connect to host {host} port 22: Operation timed out\n")
        key = tuple(argv)
        if key == PROBE:
            return CommandResult(0, "success\n")
        if key == UNAME:
            return CommandResult(0, "Darwin\n")
        if key in (SUDO_PROBE, ("sudo", "ls")):
            return CommandResult(0, "") if meta["sudo"] else CommandResult(1, "", _SUDO_REFUSED)
        if key in FILES:
            return self._file(hdir, FILES[key], meta)
        if key[:1] == ("sudo",) and any(w in ("ifconfig", "route") for w in key):
            if not meta["sudo"]:
                return CommandResult(1, "", _SUDO_REFUSED)
            if "inet" in key[:-1]:
                self.addresses.setdefault(host, set()).add(key[key.index("inet") + 1])
            return CommandResult(0, "")
        if len(key) > 4 and key[1] == "-c" and key[3] in AGENT_ROLES:
            return self._agent(host, key[3], _agent_options(key[4:]))
        return CommandResult(127, "", f"zsh:1: command not found: {key[0] if key else ''}\n")

    def _agent(self, host: str, role: str, opts: dict[str, str]) -> CommandResult:
        """The cable check agent's answer on ``host``, from ``cablecheck.json`` (the recorded cable's line)."""
        bind, port = opts.get("bind", ""), opts.get("port", "")
        if bind not in self.addresses.get(host, set()):
            what = (f"cannot listen on {bind} port {port}" if role == "serve"
                    else f"cannot connect from {bind} to {opts.get('to', '')} port {port}")
            hint = " (is that address on this host? apply the setup first)" if role == "serve" else ""
            return CommandResult(1, "", f"cablecheck {role}: {what}: Can't assign requested address{hint}\n")
        path = self.folder / CABLE_CHECK
        if not path.exists():
            return CommandResult(1, "", f"cablecheck {role}: this recording has no cable check ({path})\n")
        key = (bind, opts.get("to")) if role == "send" else None
        for cable in json.loads(path.read_text())["cables"]:
            if (role == "send" and (cable["a_ip"], cable["b_ip"]) == key) or (role == "serve" and cable["b_ip"] == bind):
                return CommandResult(0, json.dumps({"role": role, **cable[role]}) + "\n")
        return CommandResult(1, "", f"cablecheck {role}: no cable from {bind} recorded in {path}\n")

    @staticmethod
    def _file(hdir: Path, name: str, meta: dict[str, Any]) -> CommandResult:
        path = hdir / name
        out = path.read_bytes().decode("utf-8", errors="replace") if path.exists() else ""
        stem = name.split(".")[0]
        if stem in meta["exit_codes"]:
            rc = int(meta["exit_codes"][stem])
        elif stem in ("en0", "en1"):
            rc = 0 if out.strip() else 1  # `ipconfig getifaddr` exits 1 without an address
        else:
            rc = 0
        return CommandResult(rc, out, meta["stderr"].get(stem, ""))


def _agent_options(words: Sequence[str]) -> dict[str, str]:
    """``--exit-on-eof --bind X --port P ...`` -> {"bind": X, "port": P, ...} (flags without a value dropped)."""
    opts: dict[str, str] = {}
    i = 0
    while i < len(words):
        if words[i].startswith("--") and i + 1 < len(words) and not words[i + 1].startswith("--"):
            opts[words[i][2:].replace("-", "_")] = words[i + 1]
            i += 2
        else:
            i += 1
    return opts


def load_case(folder: Path, hosts: Sequence[str] | None = None) -> tuple[list[str], dict[str, Outputs], dict[str, bool]]:
    """(host names, outputs per host, passwordless sudo per host) of a recorded cluster."""
    rec = Recording(folder)
    names = list(hosts) if hosts is not None else rec.hosts()
    outputs: dict[str, Outputs] = {}
    sudo: dict[str, bool] = {}
    for name in names:
        probe = rec.answer(name, PROBE)
        if not probe.ok:
            raise DiscoveryError(name, "ssh", f"cannot reach the host ({probe.stderr.strip()})")
        outputs[name] = {cmd: rec.answer(name, cmd) for cmd in DISCOVERY}
        sudo[name] = rec.answer(name, SUDO_PROBE).ok
    return names, outputs, sudo

