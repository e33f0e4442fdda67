"""A `Runner` that answers from a recorded cluster and logs every call (our own, for tests)."""

from __future__ import annotations

import asyncio
from typing import Sequence

from mlx_jupyter.topology import CommandResult, Recording


class FakeRunner:
    """Serves a fixture folder; records calls and how many hosts were busy at once."""

    def __init__(self, folder, answers: dict | None = None, reached: dict[str, str] | None = None) -> None:
        self.recording = Recording(folder) if folder is not None else None
        self.answers = answers or {}  # (host, argv tuple) -> CommandResult, checked first
        self.reached = reached or {}  # host -> the address "ssh" reached it at
        self.calls: list[tuple[str, tuple[str, ...]]] = []
        self.busy: dict[str, int] = {}
        self.peak_hosts = 0

    async def run(self, host: str, argv: Sequence[str], stdin: str = "") -> CommandResult:
        key = tuple(argv)
        self.calls.append((host, key))
        self.busy[host] = self.busy.get(host, 0) + 1
        self.peak_hosts = max(self.peak_hosts, sum(1 for v in self.busy.values() if v))
        await asyncio.sleep(0)  # let the other hosts' calls start: shows whether they overlap
        self.busy[host] -= 1
        if (host, key) in self.answers:
            return self.answers[(host, key)]
        if self.recording is None:
            return CommandResult(127, "", f"command not found: {key[0]}\n")
        return self.recording.answer(host, key)

    def peer_address(self, host: str) -> str | None:
        return self.reached.get(host)

    def setup_calls(self, host: str) -> list[str]:
        """The setup commands `host` received (sudo probe left out), as command lines."""
        return [" ".join(a) for h, a in self.calls if h == host and a[:1] == ("sudo",) and a != ("sudo", "-n", "true")]


def as_run(lines: list[str]) -> list[str]:
    """Printed setup lines (`sudo ifconfig ...`) as auto-setup sends them (`sudo -n ifconfig ...`)."""
    return ["sudo -n " + line.removeprefix("sudo ") for line in lines]
