"""Cable check, the pure part: which cables to measure, in which rounds, and what the numbers mean.

A check sends a short bounded TCP transfer each way over every cable of the address
plan and times a few round trips (the I/O is `mlx_jupyter.configurator.measure`). Here: the
targets, rounds of cables that share no host (run in parallel), parsing the sender's
JSON line, Gb/s, the flagging rules and the report.
"""

from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass, field
from typing import Any, Sequence

from .topology import Topology
from .model import generation_of

SLOW_FRACTION = 0.5  # a link below half its nominal speed is flagged
ASYMMETRY_FACTOR = 2.0  # one direction more than twice the other is flagged


@dataclass(frozen=True)
class Target:
    """One cable to measure: both ends' ssh names and plan addresses, and its nominal speed (None: unknown)."""

    id: int
    a: str
    a_ip: str
    b: str
    b_ip: str
    nominal_gbps: float | None = None
    label: str = ""

    @property
    def name(self) -> str:
        """`h1 en2 <-> h2 en3`, or the addresses when no label was given."""
        return self.label or f"{self.a} {self.a_ip} <-> {self.b} {self.b_ip}"


def targets(topo: Topology) -> list[Target]:
    """A target per addressed cable of the plan; `id` is the cable's index in `topo.cables`."""
    index = {id(c): k for k, c in enumerate(topo.cables)}
    out = []
    for lk in topo.links():
        c = lk.cable
        assert c.b is not None
        a, b = topo.names[c.a.host], topo.names[c.b.host]
        out.append(Target(index[id(c)], a, lk.a_ip, b, lk.b_ip, c.gbps, f"{a} {c.a.iface} <-> {b} {c.b.iface}"))
    return out


def schedule(cables: Sequence[Target]) -> list[list[Target]]:
    """Rounds of cables in which no host appears twice (greedy: each cable in the first round it fits).

    Cables of one round run in parallel; a host's cables never compete for its CPU or memory bandwidth.
    """
    rounds: list[list[Target]] = []
    busy: list[set[str]] = []
    for t in cables:
        for r, hosts in zip(rounds, busy):
            if t.a not in hosts and t.b not in hosts:
                r.append(t)
                hosts.update((t.a, t.b))
                break
        else:
            rounds.append([t])
            busy.append({t.a, t.b})
    return rounds


def gbps(nbytes: int, seconds: float) -> float:
    """Gigabits per second (10^9) of `nbytes` moved in `seconds`; 0 when nothing was timed."""
    if nbytes <= 0 or seconds <= 0 or not math.isfinite(seconds):
        return 0.0
    return nbytes * 8 / seconds / 1e9


class AgentOutputError(ValueError):
    """The sender's report line is missing or malformed."""


@dataclass(frozen=True)
class Transfer:
    """What the sender reports: bytes and nanoseconds each way (as timed by the receiver), round trips."""

    up_bytes: int
    up_ns: int
    down_bytes: int
    down_ns: int
    rtt_us: tuple[float, ...]

    @property
    def up_gbps(self) -> float:
        return gbps(self.up_bytes, self.up_ns / 1e9)

    @property
    def down_gbps(self) -> float:
        return gbps(self.down_bytes, self.down_ns / 1e9)

    @property
    def rtt_ms(self) -> float | None:
        """The median round trip in milliseconds."""
        if not self.rtt_us:
            return None
        s = sorted(self.rtt_us)
        mid = len(s) // 2
        return (s[mid] if len(s) % 2 else (s[mid - 1] + s[mid]) / 2) / 1000


def _count(data: dict[str, Any], key: str) -> int:
    v = data.get(key)
    if isinstance(v, bool) or not isinstance(v, int) or v < 0:
        raise AgentOutputError(f"{key!r} should be a non-negative integer, got {v!r}")
    return v


def parse_transfer(stdout: str) -> Transfer:
    """The last JSON line of the sender's output; raises `AgentOutputError` naming what is wrong."""
    lines = [ln for ln in stdout.splitlines() if ln.strip()]
    if not lines:
        raise AgentOutputError("the sender printed nothing")
    try:
        data = json.loads(lines[-1])
    except ValueError:
        raise AgentOutputError(f"the sender's last line is not JSON: {lines[-1][:120]!r}") from None
    if not isinstance(data, dict):
        raise AgentOutputError(f"the sender's report is not a JSON object: {lines[-1][:120]!r}")
    rtt = data.get("rtt_us")
    if not isinstance(rtt, list) or not all(
            isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x) and x >= 0 for x in rtt):
        raise AgentOutputError(f"'rtt_us' should be a list of non-negative numbers, got {rtt!r}")
    return Transfer(_count(data, "up_bytes"), _count(data, "up_ns"), _count(data, "down_bytes"),
                    _count(data, "down_ns"), tuple(float(x) for x in rtt))


@dataclass(frozen=True)
class Thresholds:
    """When a cable is flagged: below `slow_fraction` of nominal either way, or one way `asymmetry` times the other."""

    slow_fraction: float = SLOW_FRACTION
    asymmetry: float = ASYMMETRY_FACTOR

    def __post_init__(self) -> None:
        if not 0 < self.slow_fraction <= 1:
            raise ValueError(f"the slow threshold is a fraction of the nominal speed in (0, 1], got {self.slow_fraction}")
        if not self.asymmetry >= 1:
            raise ValueError(f"the asymmetry factor must be at least 1, got {self.asymmetry}")


@dataclass
class CableResult:
    """One cable's outcome: Gb/s each way and round trip, or the error; and its flags."""

    target: Target
    a_to_b_gbps: float | None = None
    b_to_a_gbps: float | None = None
    rtt_ms: float | None = None
    error: str | None = None
    flags: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return self.error is None and not self.flags

    def line(self) -> str:
        """One line for the terminal: the cable, both ways, round trip, flags or error."""
        t = self.target
        nominal = f" (nominal {_nominal_text(t.nominal_gbps)})"
        if self.error is not None:
            return f"{t.name}{nominal}: FAILED: {self.error}"
        rtt = f", round trip {self.rtt_ms:.3f} ms" if self.rtt_ms is not None else ""
        text = f"{t.name}{nominal}: {t.a}->{t.b} {self.a_to_b_gbps:.2f} Gb/s, {t.b}->{t.a} {self.b_to_a_gbps:.2f} Gb/s{rtt}"
        return text + ("" if not self.flags else "  <-- " + "; ".join(self.flags))

    def annotation(self) -> dict[str, Any]:
        """What the widget draws on the cable: a short label, the state and the details."""
        if self.error is not None:
            state, label = "failed", "check failed"
        else:
            state = "flagged" if self.flags else "ok"
            label = f"{self.a_to_b_gbps:.1f}/{self.b_to_a_gbps:.1f} Gb/s"
            if self.rtt_ms is not None:
                label += f" · {self.rtt_ms:.2f} ms"
        return {"state": state, "label": label, "a_to_b_gbps": self.a_to_b_gbps, "b_to_a_gbps": self.b_to_a_gbps,
                "rtt_ms": self.rtt_ms, "nominal_gbps": self.target.nominal_gbps, "flags": list(self.flags),
                "error": self.error}


def _nominal_text(g: float | None) -> str:
    if g is None:
        return "unknown speed"
    gen = generation_of(g)
    return f"Thunderbolt {gen}, {g:g} Gb/s" if gen and gen >= 4 else f"{g:g} Gb/s"


def flags(target: Target, a_to_b: float, b_to_a: float, th: Thresholds) -> list[str]:
    """The flagging rules: slow against the nominal speed (when known), and asymmetric."""
    out = []
    if target.nominal_gbps:
        floor = th.slow_fraction * target.nominal_gbps
        slow = [f"{x}->{y} {g:.2f} Gb/s" for x, y, g in ((target.a, target.b, a_to_b), (target.b, target.a, b_to_a))
                if g < floor]
        if slow:
            out.append(f"slow: {', '.join(slow)} is under {th.slow_fraction:.0%} of {target.nominal_gbps:g} Gb/s")
    lo, hi = sorted((a_to_b, b_to_a))
    if hi > 0 and (lo == 0 or hi / lo > th.asymmetry):
        ratio = "one way only" if lo == 0 else f"{hi / lo:.1f}x"
        out.append(f"asymmetric: {a_to_b:.2f} vs {b_to_a:.2f} Gb/s ({ratio}, over {th.asymmetry:g}x)")
    return out


def judge(target: Target, transfer: Transfer, th: Thresholds) -> CableResult:
    """A measured cable's result with its flags."""
    up, down = transfer.up_gbps, transfer.down_gbps
    return CableResult(target, up, down, transfer.rtt_ms, None, flags(target, up, down, th))


@dataclass
class Report:
    """Every cable's result, in plan order, and whether the whole check ran out of time."""

    results: list[CableResult]
    thresholds: Thresholds = field(default_factory=Thresholds)
    seconds: float = 0.0

    @property
    def failed(self) -> list[CableResult]:
        return [r for r in self.results if r.error is not None]

    @property
    def flagged(self) -> list[CableResult]:
        return [r for r in self.results if r.error is None and r.flags]

    @property
    def ok(self) -> bool:
        return all(r.ok for r in self.results)

    def summary(self) -> str:
        """`3 cables checked in 4.2 s: 2 ok, 1 flagged, 0 failed`."""
        n = len(self.results)
        return (f"{n} cable{'s' if n != 1 else ''} checked in {self.seconds:.1f} s: "
                f"{n - len(self.failed) - len(self.flagged)} ok, {len(self.flagged)} flagged, {len(self.failed)} failed")

    def text(self) -> str:
        """The report for a terminal: one line per cable, then the summary."""
        return "\n".join([r.line() for r in self.results] + [self.summary()]) + "\n"

    def annotations(self) -> dict[int, dict[str, Any]]:
        """Cable id (index in `Topology.cables`) -> what the widget draws on it."""
        return {r.target.id: r.annotation() for r in self.results}

    def to_json(self) -> dict[str, Any]:
        return {"summary": self.summary(), "seconds": self.seconds, "thresholds": asdict(self.thresholds),
                "cables": [{"cable": asdict(r.target), **r.annotation()} for r in self.results]}
