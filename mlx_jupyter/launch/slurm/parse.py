"""What Slurm's commands print, read back (pure): job ids, job and node states, times, srun's messages.

All of it is untrusted text: every parser either returns a value it has checked
or raises :class:`SlurmOutputError` quoting the offending text (tasks print
what they like, and a site's Slurm may be another version).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Optional


class SlurmOutputError(ValueError):
    """A Slurm command printed something we cannot read; the message quotes it."""


#: A node name as Slurm allows it (a DNS label-ish word; hostlist brackets are expanded before).
_NODE = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9._-]*$")
#: A job id as printed (``123``), optionally with a step (``123.0``) or array task (``123_4``).
_JOB_ID = re.compile(r"^[0-9]+$")


def _quote(text: str, limit: int = 120) -> str:
    return repr(text if len(text) <= limit else text[:limit] + "...")


def check_node_name(name: str) -> str:
    """``name`` if it is a plain node name, else :class:`SlurmOutputError`."""
    if not _NODE.match(name):
        raise SlurmOutputError(f"{_quote(name)} is not a Slurm node name")
    return name


def parse_job_id(text: str) -> int:
    """``sbatch --parsable`` output (``"123"`` or ``"123;cluster"``) -> 123."""
    first = text.strip().split(";", 1)[0].strip()
    if not _JOB_ID.match(first) or int(first) <= 0:
        raise SlurmOutputError(f"sbatch --parsable printed {_quote(text.strip())}, not a job id")
    return int(first)


def parse_hostnames(text: str) -> list[str]:
    """``scontrol show hostnames LIST`` output: one node name per line, in the list's order."""
    names = [line.strip() for line in text.splitlines() if line.strip()]
    if not names:
        raise SlurmOutputError("scontrol show hostnames printed no node name")
    return [check_node_name(n) for n in names]


_TIME = re.compile(r"^(?:(\d+)-)?(\d+)(?::(\d+))?(?::(\d+))?$")
#: Words squeue prints instead of a duration.
NO_TIME = ("UNLIMITED", "INVALID", "NOT_SET", "N/A", "Partition_Limit", "")


def parse_duration(text: str) -> Optional[int]:
    """A squeue duration (``[D-]HH:MM:SS``, ``MM:SS``, ``D-HH``) in seconds; None for UNLIMITED and the like."""
    text = text.strip()
    if text in NO_TIME:
        return None
    m = _TIME.match(text)
    if not m:
        raise SlurmOutputError(f"{_quote(text)} is not a Slurm duration")
    days, a, b, c = m.groups()
    if days is not None:   # D-HH, D-HH:MM, D-HH:MM:SS
        h, mi, s = int(a), int(b or 0), int(c or 0)
        return ((int(days) * 24 + h) * 60 + mi) * 60 + s
    if c is not None:      # HH:MM:SS
        return (int(a) * 60 + int(b)) * 60 + int(c)
    if b is not None:      # MM:SS
        return int(a) * 60 + int(b)
    return int(a) * 60     # minutes


def format_duration(seconds: Optional[int]) -> str:
    """Seconds as a person reads them: ``1 h 05 min``, ``4 min 10 s``, ``12 s``; ``unlimited`` for None."""
    if seconds is None:
        return "unlimited"
    seconds = max(int(seconds), 0)
    d, rest = divmod(seconds, 86400)
    h, rest = divmod(rest, 3600)
    m, s = divmod(rest, 60)
    if d:
        return f"{d} d {h} h"
    if h:
        return f"{h} h {m:02d} min"
    if m:
        return f"{m} min {s:02d} s" if s else f"{m} min"
    return f"{s} s"


#: squeue's output format for :func:`parse_squeue_line`: fixed fields first, the free-text reason last.
SQUEUE_FORMAT = "%i|%T|%M|%L|%l|%D|%N|%r"
#: Job states after which a job holds no nodes.
FINISHED = ("BOOT_FAIL", "CANCELLED", "COMPLETED", "DEADLINE", "FAILED", "NODE_FAIL", "OUT_OF_MEMORY",
            "PREEMPTED", "TIMEOUT", "SPECIAL_EXIT", "REVOKED")


@dataclass(frozen=True)
class JobState:
    """One job as squeue shows it."""

    job_id: int
    state: str                   # PENDING, RUNNING, COMPLETING, TIMEOUT...
    reason: str                  # Resources, Priority, None, TimeLimit, NodeDown...
    nodes: str                   # the hostlist expression (empty while pending)
    node_count: int
    elapsed: Optional[int]       # seconds
    time_left: Optional[int]     # seconds; None: unlimited or unknown
    time_limit: Optional[int]    # seconds; None: unlimited

    @property
    def pending(self) -> bool:
        return self.state in ("PENDING", "CONFIGURING", "REQUEUED", "RESIZING", "SUSPENDED")

    @property
    def running(self) -> bool:
        return self.state == "RUNNING"

    @property
    def finished(self) -> bool:
        return self.state in FINISHED or self.state == "COMPLETING"

    def describe(self) -> str:
        """``PENDING (Resources)``, ``RUNNING on node[1-4]``, ``TIMEOUT on node[1-4]``."""
        if self.pending:
            return f"{self.state} ({self.reason})" if self.reason and self.reason != "None" else self.state
        where = f" on {self.nodes}" if self.nodes else ""
        return f"{self.state}{where}"


def parse_squeue_line(line: str) -> JobState:
    """One line of ``squeue -h -o SQUEUE_FORMAT``."""
    parts = line.rstrip("\n").split("|", 7)
    if len(parts) != 8:
        raise SlurmOutputError(f"squeue printed {_quote(line)}: expected 8 fields separated by '|'")
    job, state, elapsed, left, limit, count, nodes, reason = parts
    job = job.strip()
    if not _JOB_ID.match(job):
        raise SlurmOutputError(f"squeue printed {_quote(line)}: {_quote(job)} is not a job id")
    if not re.match(r"^[A-Z_]+$", state.strip()):
        raise SlurmOutputError(f"squeue printed {_quote(line)}: {_quote(state)} is not a job state")
    if not count.strip().isdigit():
        raise SlurmOutputError(f"squeue printed {_quote(line)}: {_quote(count)} is not a node count")
    nodes = nodes.strip()
    if nodes and not re.match(r"^[A-Za-z0-9._\-\[\],]+$", nodes):
        raise SlurmOutputError(f"squeue printed {_quote(line)}: {_quote(nodes)} is not a node list")
    try:
        times = [parse_duration(t) for t in (elapsed, left, limit)]
    except SlurmOutputError as exc:
        raise SlurmOutputError(f"squeue printed {_quote(line)}: {exc}") from None
    return JobState(int(job), state.strip(), reason.strip(), nodes, int(count), *times)


@dataclass(frozen=True)
class NodeInfo:
    """One node as sinfo shows it: its address and state (``idle``, ``allocated*``, ``down*``...)."""

    name: str
    addr: str
    state: str

    @property
    def responding(self) -> bool:
        """sinfo marks a node that does not answer the controller with ``*``."""
        return not self.state.endswith("*")


#: sinfo's format for :func:`parse_sinfo_line`.
SINFO_FORMAT = "%N|%o|%T"


def parse_sinfo_line(line: str) -> NodeInfo:
    """One line of ``sinfo -h -N -o SINFO_FORMAT``."""
    parts = line.strip().split("|")
    if len(parts) != 3:
        raise SlurmOutputError(f"sinfo printed {_quote(line)}: expected 3 fields separated by '|'")
    name, addr, state = (p.strip() for p in parts)
    check_node_name(name)
    if not re.match(r"^[A-Za-z0-9._:\-\[\]%]+$", addr):
        raise SlurmOutputError(f"sinfo printed {_quote(line)}: {_quote(addr)} is not a node address")
    if not re.match(r"^[a-z_]+[*~#!%$@^-]*$", state.lower()):
        raise SlurmOutputError(f"sinfo printed {_quote(line)}: {_quote(state)} is not a node state")
    return NodeInfo(name, addr, state)


def parse_task_list(text: str) -> list[int]:
    """srun's task list (``3``, ``0-1,4``) -> task ids."""
    out: list[int] = []
    for part in text.split(","):
        m = re.match(r"^\s*(\d+)(?:-(\d+))?\s*$", part)
        if not m:
            raise SlurmOutputError(f"{_quote(text)} is not a task list")
        lo, hi = int(m.group(1)), int(m.group(2) or m.group(1))
        if hi < lo or hi - lo > 1_000_000:
            raise SlurmOutputError(f"{_quote(text)} is not a task list")
        out.extend(range(lo, hi + 1))
    return out


@dataclass(frozen=True)
class SrunNote:
    """Something srun or slurmstepd said about the step: a task's end, a node failure, a cancellation."""

    kind: str                     # "task" | "node_failure" | "cancelled"
    node: Optional[str] = None
    tasks: tuple[int, ...] = ()
    what: str = ""                # "exited with code 3" / "Killed" / "TIME LIMIT" ...
    code: Optional[int] = None    # a task's exit code when it exited


_TASK_END = re.compile(r"^srun: error: ([A-Za-z0-9._-]+): tasks? ([0-9,\- ]+): (.+?)\s*$")
_EXIT = re.compile(r"^Exited with exit code (\d+)$")
_NODE_FAIL = re.compile(r"^srun: error: Node failure on ([A-Za-z0-9._-]+)\s*$")
_CANCELLED = re.compile(r"\*\*\* (?:STEP|JOB) [0-9.+_]+ ON ([A-Za-z0-9._-]+) CANCELLED AT \S+"
                        r"(?: DUE TO ([A-Z][A-Z ]*?)(?=,| \*\*\*| \())?[^*]*\*\*\*")


def parse_srun_line(line: str) -> Optional[SrunNote]:
    """A note if ``line`` (srun's own, or slurmstepd's in a task's stderr) reports how the step ends."""
    m = _TASK_END.match(line)
    if m:
        try:
            tasks = tuple(parse_task_list(m.group(2)))
        except SlurmOutputError:
            return None
        what = m.group(3)
        code = _EXIT.match(what)
        return SrunNote("task", m.group(1), tasks, f"exited with code {code.group(1)}" if code else what,
                        int(code.group(1)) if code else None)
    m = _NODE_FAIL.match(line)
    if m:
        return SrunNote("node_failure", m.group(1), what="node failure")
    m = _CANCELLED.search(line)
    if m:
        return SrunNote("cancelled", m.group(1), what=(m.group(2) or "").strip())
    return None


_LABEL = re.compile(r"^ *(\d+): ")


def split_label(line: str) -> Optional[tuple[int, str]]:
    """``srun --label`` output (``" 3: text"``) -> (3, "text"); None for srun's own, unlabelled, lines."""
    m = _LABEL.match(line)
    if not m:
        return None
    return int(m.group(1)), line[m.end():]
