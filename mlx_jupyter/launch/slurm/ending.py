"""How a Slurm step ended, in one line: each rank's fate, and the job's when Slurm ended it.

A rank's exit comes from the task wrapper's report; failing that, from srun's
own message (``node2: task 1: Killed``); a rank with neither on a node that
stopped answering is *lost*. When srun ends badly and we did not stop it,
squeue says why the job ended: its time limit, a node failure, a cancellation.
"""

from __future__ import annotations

import asyncio
import signal as _signal
import sys
from typing import TYPE_CHECKING, Optional

from mlx_jupyter.vocab.rankinfo import EXITED, KILLED, LOST, PENDING, RankInfo, describe_exit
from mlx_jupyter.launch.slurm import commands
from mlx_jupyter.launch.slurm.commands import SlurmError
from mlx_jupyter.launch.slurm.parse import JobState, SrunNote, format_duration

if TYPE_CHECKING:
    from mlx_jupyter.launch.launch_config import LaunchConfig
    from mlx_jupyter.launch.slurm.allocation import Allocation
    from mlx_jupyter.launch.slurm.output import StepOutput

PROG = "mlx-jupyter launch"

#: What srun prints for a task killed by a signal (strsignal), as exit codes 128 + N.
_SIGNAL_TEXT = {"Killed": _signal.SIGKILL, "Terminated": _signal.SIGTERM, "Interrupt": _signal.SIGINT,
                "Aborted": _signal.SIGABRT, "Segmentation fault": _signal.SIGSEGV, "Hangup": _signal.SIGHUP,
                "Bus error": _signal.SIGBUS, "Floating point exception": _signal.SIGFPE}
#: Exit codes of a rank that Slurm (not its own code) ended.
_ENDED_BY_SIGNAL = {128 + int(s) for s in (_signal.SIGTERM, _signal.SIGKILL, _signal.SIGINT, _signal.SIGHUP)}


def note_code(note: SrunNote) -> Optional[int]:
    """A task's exit code from srun's message about it (128 + N for a signal)."""
    if note.code is not None:
        return note.code
    for text, sig in _SIGNAL_TEXT.items():
        if note.what.startswith(text):
            return 128 + int(sig)
    return None


class Ending:
    """Part of :class:`~mlx_jupyter.launch.slurm.job.SlurmJob`: its end, told. The state below is the job's
    (it sets every field in its ``__init__``); this part reads it and settles the ranks' fates in it."""

    config: LaunchConfig
    allocation: Optional[Allocation]
    ranks: list[RankInfo]
    failures: list[int]           # ranks that failed by themselves, first first
    end_note: str                 # how Slurm ended the job, if it did
    _output: Optional[StepOutput]
    _srun_code: Optional[int]
    _stopping: bool
    _fail_timer: Optional[asyncio.TimerHandle]   # set once a rank failed and the others are being ended
    _told: set[int]               # ranks whose end on_exit has heard of
    _lost_why: dict[str, str]     # node -> why its ranks were lost

    @property
    def job_id(self) -> Optional[int]:
        """The Slurm job the step runs in, once known."""
        return self.allocation.job_id if self.allocation else None

    def _tell_exit(self, rank: int, code: Optional[int]) -> None:
        """``on_exit(rank, code)`` once per rank; None when no code is known (a rank lost, or ended by Slurm
        with its wrapper: "exit status unknown", not a made-up signal)."""
        if rank in self._told or self.config.on_exit is None:
            return
        self._told.add(rank)
        try:
            self.config.on_exit(rank, code)
        except Exception as exc:  # noqa: BLE001 - a user callback must not kill the launcher
            print(f"{PROG}: on_exit callback failed: {exc!r}", file=sys.stderr)

    def srun_said(self) -> str:
        """srun's last lines of its own, joined."""
        return " / ".join(self._output.own) if self._output is not None else ""

    async def _conclude(self) -> None:
        """After srun: settle every rank's state; ask Slurm why the job ended if it ended badly."""
        notes = list(self._output.notes) if self._output is not None else []
        failed_nodes = {n.node for n in notes if n.kind == "node_failure" and n.node is not None}
        by_task = {t: n for n in notes if n.kind == "task" for t in n.tasks}
        for info in self.ranks:
            if info.returncode is not None or info.state == PENDING:   # ended, or never started
                continue
            note = by_task.get(info.rank)
            if note is not None and note.node not in failed_nodes:
                info.returncode = note_code(note)
                if info.state != KILLED:
                    info.state = EXITED
                if info.returncode not in (0, None) and (info.state != KILLED or self._fail_timer is not None):
                    self.failures.append(info.rank)
            elif info.host in failed_nodes or not self._stopping_by_us():
                # no word of its end, though srun ended (or was told to end it after a failure): its node is silent
                info.state = LOST
        self._settle_failures(notes)
        trouble = self.failures or any(i.state == LOST for i in self.ranks) or self._srun_code not in (0, None)
        if trouble and not self._stopping_by_us() and self.job_id is not None:
            await self._explain(notes, failed_nodes, self.job_id)
        self._lost_why = await self._lost_reasons(failed_nodes)
        for info in self.ranks:   # the ends heard of only now (srun's notes, the silent): on_exit too
            if info.state != PENDING:
                self._tell_exit(info.rank, info.returncode)

    def _settle_failures(self, notes: list[SrunNote]) -> None:
        """The ranks that failed by themselves, first first. Reports travel on two channels (the wrapper's
        through the step's output, srun's own), so a rank srun terminated (128 + TERM/KILL) may be heard
        of before the rank whose failure made srun do it: such a rank is terminated, not failed, when
        another failed with a code of its own; srun's order of task ends decides which came first."""
        if not self.failures or not self.config.terminate_on_failure:
            return
        own = [r for r in self.failures if self.ranks[r].returncode not in _ENDED_BY_SIGNAL] or self.failures[:1]
        srun_order = [t for n in notes if n.kind == "task" and n.code not in (None, 0) for t in n.tasks]
        own.sort(key=lambda r: srun_order.index(r) if r in srun_order else len(srun_order))
        for r in self.failures:
            if r not in own:
                self.ranks[r].state = KILLED
        for r in own:
            self.ranks[r].state = EXITED
        self.failures = own

    def _stopping_by_us(self) -> bool:
        """Whether we ended the step (a stop, not the failure timer)."""
        return self._stopping and self._fail_timer is None

    async def _explain(self, notes: list[SrunNote], failed_nodes: set[str], job_id: int) -> None:
        try:
            state: Optional[JobState] = await asyncio.to_thread(commands.job_state, job_id)
        except SlurmError:
            state = None
        cancelled = [n for n in notes if n.kind == "cancelled"]
        why = {n.what for n in cancelled}
        # our own job's nodes are the step's; squeue's shrink while the job completes, node by node
        ours = self.allocation.nodelist if self.allocation is not None and self.allocation.owned else ""
        where = ours or (state.nodes if state and state.nodes else "") or next((n.node for n in cancelled if n.node), "")
        on = f" on {where}" if where else ""
        job = f"Slurm job {job_id}"
        ended = (state.state, state.reason) if state else ("", "")
        if "TIMEOUT" in ended or "TimeLimit" in ended or "TIME LIMIT" in why:
            limit = f" ({format_duration(state.time_limit)})" if state and state.time_limit else ""
            self.end_note = f"{job} reached its time limit{limit}{on}: its ranks were terminated"
        elif failed_nodes or "NODE_FAIL" in ended or "NodeDown" in ended or "NODE FAILURE" in why:
            nodes = ", ".join(sorted(failed_nodes)) or where or "?"
            self.end_note = f"{job}: node {nodes} failed (Slurm lost contact with it)"
        elif (state and state.state in ("CANCELLED", "PREEMPTED")) or any(why - {""}) or (cancelled and not self.failures):
            # (a step cancelled without a reason after a rank failed: that was srun's --kill-on-bad-exit)
            what = "preempted" if (state and state.state == "PREEMPTED") or "PREEMPTION" in why else \
                "cancelled (scancel, or an administrator)"
            self.end_note = f"{job} was {what}{on}"
        if self.end_note:   # Slurm's signals, not the ranks' own failures
            for r in list(self.failures):
                info = self.ranks[r]
                if info.returncode in _ENDED_BY_SIGNAL:
                    self.failures.remove(r)
                    info.state = KILLED

    async def _lost_reasons(self, failed_nodes: set[str]) -> dict[str, str]:
        lost = sorted({i.host for i in self.ranks if i.state == LOST})
        if not lost:
            return {}
        why = {n: "node failure reported by srun" for n in failed_nodes}
        try:
            info = await asyncio.to_thread(commands.nodes_info, lost)
        except SlurmError:
            info = {}
        for node in lost:
            if node in info and not info[node].responding:
                why[node] = f"{node} is not responding ({info[node].state})"
            why.setdefault(node, f"{node} did not report the end of its task")
        return why

    def exit_code(self) -> int:
        """0 if every rank exited 0; else the first failing rank's code (255: lost), as a ``Job`` says,
        then the first nonzero code of a rank that was terminated, then srun's."""
        for r in self.failures:
            code = self.ranks[r].returncode
            return 255 if code is None else code
        if any(i.state == LOST for i in self.ranks):
            return 255
        codes = [i.returncode for i in self.ranks if i.returncode not in (0, None)]
        if self._srun_code not in (0, None):
            codes.append(self._srun_code)
        if codes:
            return 128 - codes[0] if codes[0] < 0 else min(codes[0], 255)
        return 1 if self.end_note else 0

    def summary(self) -> str:
        """One line: how Slurm ended the job, then each failed, lost or terminated rank with its node."""
        parts = [self.end_note] if self.end_note else []
        for r in self.failures:
            i = self.ranks[r]
            parts.append(f"rank {r} on {i.host} {_exited(i.returncode)}")
        why = self._lost_why
        for i in self.ranks:
            if i.state == LOST:
                parts.append(f"rank {i.rank} on {i.host} lost ({why.get(i.host, 'no end reported')})")
        killed = [i for i in self.ranks if i.state == KILLED]
        if killed:
            parts.append("terminated: " + ", ".join(f"rank {i.rank} on {i.host}" for i in killed))
        code = self._srun_code
        never = [i.rank for i in self.ranks if i.state == PENDING]
        if code not in (0, None) and not self._stopping_by_us() and (never or not parts):
            what = f" before rank(s) {', '.join(map(str, never))} started" if never else ""
            parts.append(f"srun {_exited(code)}{what}: {self.srun_said() or 'no message'}")
        return "; ".join(parts)


def _exited(code: Optional[int]) -> str:
    """``exited with code 3``, or :func:`describe_exit`'s text for a signal."""
    text = describe_exit(code)
    return f"exited with code {code}" if text.startswith("exit code") else text
