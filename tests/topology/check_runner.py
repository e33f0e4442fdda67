"""A `Runner` that answers the cable check agent's commands as scripted (our own, for tests)."""

from __future__ import annotations

import asyncio
import json
from dataclasses import dataclass
from typing import Sequence

from mlx_jupyter.topology import CommandResult


@dataclass
class Link:
    """How a scripted cable behaves: Gb/s from the a end (the sender) and back, or how it fails."""

    up_gbps: float = 40.0
    down_gbps: float = 40.0
    rtt_us: float = 50.0
    serve: CommandResult | None = None  # the receiver's result instead of success
    send: CommandResult | None = None  # the sender's
    hang: bool = False  # neither end ever answers
    taken: int = 0  # the receiver's port is taken this many times first (exit 3)


class CheckRunner:
    """Answers `serve`/`send` by the cable's addresses; other commands go to `inner` (e.g. a FakeRunner).

    Records each agent call (host, role, options) and the peak number of agents running at once per host.
    """

    def __init__(self, links: dict[tuple[str, str], Link], inner=None) -> None:
        self.links, self.inner = links, inner
        self.agent_calls: list[tuple[str, str, dict[str, str]]] = []
        self.running: dict[str, int] = {}
        self.peak_per_host = 0
        self.peak_total = 0
        self.calls: list[tuple[str, tuple[str, ...]]] = []
        self.stdins: list[str] = []   # what each agent got on stdin (its token)

    async def run(self, host: str, argv: Sequence[str], stdin: str = "") -> CommandResult:
        argv = list(argv)
        if len(argv) < 4 or argv[1] != "-c" or argv[3] not in ("serve", "send"):
            self.calls.append((host, tuple(argv)))
            if self.inner is None:
                return CommandResult(127, "", f"command not found: {argv[0]}\n")
            return await self.inner.run(host, argv, stdin)
        role = argv[3]
        assert argv[4] == "--exit-on-eof"
        opts = dict(zip((a[2:] for a in argv[5::2]), argv[6::2]))
        self.agent_calls.append((host, role, opts))
        self.stdins.append(stdin)
        link = self._link(opts, role)
        self.running[host] = self.running.get(host, 0) + 1
        self.peak_per_host = max(self.peak_per_host, self.running[host])
        self.peak_total = max(self.peak_total, sum(self.running.values()))
        try:
            await asyncio.sleep(0.01)  # overlap with the other agents of the round
            if link.hang:
                await asyncio.Event().wait()
            if role == "serve" and link.taken > 0:
                link.taken -= 1
                return CommandResult(3, "", f"port {opts['port']} on {opts['bind']} is in use\n")
            if role == "serve":
                return link.serve or CommandResult(0, json.dumps({"role": "serve"}) + "\n", "")
            if link.send is not None:
                return link.send
            up, down = (int(g * 1e9 / 8 * 0.5) for g in (link.up_gbps, link.down_gbps))
            line = {"role": "send", "up_bytes": up, "up_ns": 500_000_000, "down_bytes": down,
                    "down_ns": 500_000_000, "rtt_us": [link.rtt_us] * 5}
            return CommandResult(0, json.dumps(line) + "\n", "")
        finally:
            self.running[host] -= 1

    def _link(self, opts: dict[str, str], role: str) -> Link:
        for (a_ip, b_ip), link in self.links.items():
            if (role == "send" and (opts["bind"], opts["to"]) == (a_ip, b_ip)) or (role == "serve" and opts["bind"] == b_ip):
                return link
        return Link()

    async def close(self) -> None:
        return None
