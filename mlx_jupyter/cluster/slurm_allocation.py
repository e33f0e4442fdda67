"""A Slurm cluster's allocation, held by the notebook: asked for before the controller starts,
released at stop (or kept after a failure for a restart), and cancelled by a watchdog if the
kernel dies. The ranks run in it as one srun step (:mod:`mlx_jupyter.launch.slurm`).
"""

from __future__ import annotations

import asyncio
import os
import secrets
from dataclasses import replace
from typing import TYPE_CHECKING, Any, Callable, Mapping, Optional, Protocol, Sequence

from mlx_jupyter.cluster.shared.errors import ClusterError
from mlx_jupyter.launch.slurm import commands
from mlx_jupyter.launch.slurm.allocation import Allocation, WaitCancelled
from mlx_jupyter.launch.slurm.commands import SlurmError
from mlx_jupyter.launch.slurm.options import NAME_PREFIX, SlurmOptions, refuse_job_name
from mlx_jupyter.launch.slurm.parse import JobState, format_duration, parse_srun_line

if TYPE_CHECKING:
    from mlx_jupyter.launch.local_watchdog import LocalWatchdog
    from mlx_jupyter.vocab.rankinfo import RankInfo

#: what a cluster does with its allocation after a rank fails
ON_FAILURE = ("release", "keep")
#: seconds a status probe of the job may take (it runs while the user waits)
STATUS_TIMEOUT = 5.0


class RankOutput(Protocol):
    """The ranks' last output lines (the engine set's, :class:`~.engineset.MLXEngineSetLauncher`)."""

    @property
    def rank_output(self) -> Mapping[int, Sequence[str]]: ...


class SlurmRanks(Protocol):
    """What a dead rank's note reads of its cluster: where each rank ran, what it printed last."""

    def rank_infos(self) -> Sequence[RankInfo]: ...
    @property
    def engine_set(self) -> RankOutput: ...   # may raise once the ranks are gone


class ClusterAllocation:
    """The Slurm job a cluster's ranks run in. ``opts``: what to ask for; ``on_failure``: after a
    rank died, ``"release"`` the job at once or ``"keep"`` it for :meth:`Cluster.restart`."""

    def __init__(self, opts: SlurmOptions, on_failure: str = "release") -> None:
        if on_failure not in ON_FAILURE:
            raise ValueError(f"on_failure={on_failure!r}: expected one of {', '.join(ON_FAILURE)}")
        self.opts = opts
        self.on_failure = on_failure
        self.name = opts.job_name or NAME_PREFIX + secrets.token_hex(4)
        self.allocation: Optional[Allocation] = None
        self.nodes: list[str] = []
        self.ips: dict[str, str] = {}
        self.last_state = ""
        self.last_job_id: Optional[int] = None   # kept after a release: a dead rank's note still names the job
        self._guard: Optional[LocalWatchdog] = None

    @property
    def job_id(self) -> Optional[int]:
        return self.allocation.job_id if self.allocation is not None and not self.allocation.released else None

    def step_options(self) -> SlurmOptions:
        """What the engine set's launcher gets: the ranks in our job, its first ``nodes`` nodes (in the
        allocation we run inside, the launcher finds it itself, with ``--overlap`` inside a step)."""
        owned = self.allocation is not None and self.allocation.owned
        return replace(self.opts, job_id=self.job_id if owned else None, nodes=len(self.nodes) or self.opts.nodes,
                       on_state=None)

    # ------------------------------------------------------------ getting it

    def ensure(self, on_state: Optional[Callable[[JobState], None]] = None) -> None:
        """Hold a running allocation: ours while it still runs, else the current one (inside salloc or
        a batch-spawned server), else a new one. Ctrl-C (the stop button) while it pends cancels it."""
        try:
            if self.job_id is not None:
                state = commands.job_state(self.job_id)
                if state is not None and state.running:
                    return
                self.release()
            current = None if self.opts.allocate else Allocation.current(os.environ)
            if current is not None:
                self.allocation = alloc = current
            else:
                alloc = self._submit(on_state)
            nodes = alloc.nodes()
            want = self.opts.nodes or len(nodes)
            if want > len(nodes):
                raise ClusterError(f"--nodes {want}: Slurm job {alloc.job_id} has only "
                                   f"{len(nodes)} node(s) ({', '.join(nodes)})")
            self.nodes = nodes[:want]
            self.last_job_id = alloc.job_id
            info = commands.nodes_info(self.nodes)
            self.ips = {n: commands.node_ip(info[n]) for n in self.nodes}
        except SlurmError as exc:
            self.release()
            raise ClusterError(str(exc)) from None

    def _submit(self, on_state: Optional[Callable[[JobState], None]]) -> Allocation:
        """A new job of ours (now :attr:`allocation`), once it runs."""
        import threading

        guard = self._watchdog()
        guard.register_job(f"name={self.name}")   # before sbatch: the kernel may die before it answers
        try:
            self.allocation = alloc = Allocation.submit(self.opts, self.name)
        except SlurmError as exc:
            # sbatch failed or did not answer, yet the job may be queued: the watchdog, closed with its name
            # still registered, cancels it by that name (as `mlx-jupyter launch --slurm` does)
            self._close_watchdog(cancel=True)
            raise SlurmError(f"{exc} (a job it may have queued, named {self.name}, was cancelled)") from None
        guard.register_job(str(alloc.job_id))

        show = on_state or self.opts.on_state

        def seen(state: JobState) -> None:
            self.last_state = state.describe()
            if show is not None:
                show(state)

        try:   # on this thread: a KeyboardInterrupt (the stop button) lands in its wait
            alloc.wait_running(threading.Event(), self.opts.poll_interval, seen)
        except KeyboardInterrupt:
            job = alloc.job_id
            self.release()
            raise ClusterError(f"Slurm job {job} cancelled while {self.last_state or 'PENDING'}: "
                               "nothing is left in the queue") from None
        except WaitCancelled as exc:
            raise ClusterError(str(exc)) from None
        return alloc

    def _watchdog(self) -> LocalWatchdog:
        """The kernel's watchdog on our job: it scancels it if this process dies, even by SIGKILL."""
        if self._guard is None:
            from mlx_jupyter.launch.launcher import _background_loop
            from mlx_jupyter.launch.local_watchdog import LocalWatchdog

            env = {k: v for k, v in os.environ.items() if k.startswith("SLURM_")}
            fut = asyncio.run_coroutine_threadsafe(LocalWatchdog.start(env), _background_loop())
            self._guard = fut.result(30)
        return self._guard

    def controller_ip(self) -> str:
        """This machine's address toward the first node: where the ranks reach the controller."""
        from mlx_jupyter.net.resolve import source_ip_toward

        try:
            return source_ip_toward(self.ips[self.nodes[0]])
        except (OSError, IndexError, KeyError) as exc:
            raise ClusterError(f"no route from here to Slurm node {self.nodes[0] if self.nodes else '?'}: {exc}; "
                               "give controller_ip (--controller-ip), an address of this machine the nodes reach") from None

    # ------------------------------------------------------------ letting go

    def release(self) -> None:
        """scancel our job (once); forget the one we ran inside without cancelling it."""
        alloc, self.allocation = self.allocation, None
        if alloc is not None and alloc.owned and not alloc.released:
            try:
                alloc.release()
            except SlurmError:
                pass   # the watchdog, closed below, tries once more
        self._close_watchdog(cancel=alloc is not None and alloc.owned and not alloc.released)

    def _close_watchdog(self, cancel: bool) -> None:
        guard, self._guard = self._guard, None
        if guard is None:
            return
        if not cancel:
            for target in list(os.listdir(os.path.join(guard.path, "slurm"))):
                guard.unregister_job(target)
        from mlx_jupyter.launch.launcher import _background_loop

        try:
            asyncio.run_coroutine_threadsafe(guard.close(), _background_loop()).result(30)
        except Exception:
            pass

    # ------------------------------------------------------------ telling

    def state(self) -> Optional[JobState]:
        """The job as squeue shows it now (None when unknown)."""
        if self.job_id is None:
            return None
        try:
            return commands.job_state(self.job_id)
        except SlurmError:
            return None

    def info(self) -> dict[str, Any]:
        """For status and the panel: the job id, its state, nodes and time left."""
        if self.job_id is None:
            return {"job_id": None, "state": "released", "reason": "", "nodes": "", "time_left": None,
                    "time_left_text": "", "on_failure": self.on_failure}
        return {**job_info(self.job_id), "on_failure": self.on_failure}

    def summary(self) -> str:
        """``Slurm job 12 RUNNING on node[1-2], 4 min 10 s left``."""
        i = self.info()
        if i["job_id"] is None:
            return "Slurm: no job held"
        left = f", {i['time_left_text']} left" if i["time_left_text"] else ""
        return f"Slurm job {i['job_id']} {describe_info(i)}{left} (on failure: {self.on_failure})"

    def rank_note(self, cluster: SlurmRanks, rank: int) -> str:
        """:meth:`death_note` for ``cluster``'s ``rank``: its node and its last output."""
        infos = cluster.rank_infos()
        try:
            output = list(cluster.engine_set.rank_output.get(rank, []))
        except Exception:
            output = []
        return self.death_note(infos[rank].host if rank < len(infos) else "?", output)

    def death_note(self, node: str, output: list[str]) -> str:
        """One line on why a rank on ``node`` ended, when Slurm ended it (time limit, node failure)."""
        job = self.job_id or self.last_job_id
        for line in reversed(output[-20:]):
            note = parse_srun_line(line)
            if note is not None and note.kind == "cancelled" and note.what:
                if "TIME LIMIT" in note.what:
                    return f"Slurm job {job} reached its time limit on {note.node or node}"
                return f"Slurm job {job} was cancelled on {note.node or node} ({note.what.lower()})"
        try:
            state = commands.job_state(job) if job is not None else None
        except SlurmError:
            state = None
        if state is None:
            return ""
        if state.state == "TIMEOUT" or state.reason == "TimeLimit":
            return f"Slurm job {job} reached its time limit on {node}"
        if state.state == "NODE_FAIL" or "NodeDown" in state.reason:
            return f"Slurm job {job}: node {node} failed (Slurm lost contact with it)"
        return ""


def for_cluster(scheduler: Optional[str], slurm: Optional[SlurmOptions], hosts: bool, *, n: Optional[int],
                nodes: Optional[int], partition: Optional[str], time: Optional[str], account: Optional[str],
                args: Sequence[str], on_failure: str) -> Optional[ClusterAllocation]:
    """The allocation of a ``Cluster(scheduler="slurm", ...)`` (None for hosts of its own)."""
    asked = nodes is not None or partition or time or account or args
    if scheduler in (None, "") and slurm is None:
        if asked:
            raise ValueError("nodes, partition, time, account and slurm_args need scheduler='slurm'")
        return None
    if scheduler not in ("slurm", None):
        raise ValueError(f"scheduler={scheduler!r}: the only scheduler is 'slurm'")
    if hosts:
        raise ValueError("scheduler='slurm' takes its nodes from Slurm: give no hosts or hostfile")
    if nodes is not None and nodes < 1:
        raise ValueError(f"nodes must be at least 1, got {nodes}")
    base = slurm or SlurmOptions()
    refuse_job_name([*base.args, *args])
    opts = replace(base, nodes=nodes if nodes is not None else base.nodes,
                   ranks_per_node=int(n) if n is not None else base.ranks_per_node,
                   partition=partition or base.partition, time=time or base.time, account=account or base.account,
                   args=[*base.args, *args])
    return ClusterAllocation(opts, on_failure)


def job_info(job_id: int) -> dict[str, Any]:
    """The job's id, state word (RUNNING, PENDING...), pending reason, nodes and time left, as squeue shows
    them now (``state: gone`` once forgotten); :func:`describe_info` puts them in one phrase."""
    try:
        state = commands.job_state(job_id)
    except SlurmError as exc:
        return {"job_id": job_id, "state": f"unknown ({exc})", "reason": "", "nodes": "", "time_left": None,
                "time_left_text": ""}
    if state is None:
        return {"job_id": job_id, "state": "gone", "reason": "", "nodes": "", "time_left": None, "time_left_text": ""}
    return state_info(state)


def state_info(state: JobState) -> dict[str, Any]:
    """:func:`job_info` of a job squeue showed as ``state``."""
    reason = state.reason if state.pending and state.reason not in ("", "None") else ""
    return {"job_id": state.job_id, "state": state.state, "reason": reason, "nodes": state.nodes,
            "time_left": state.time_left,
            "time_left_text": format_duration(state.time_left) if state.running else ""}


def describe_info(info: dict[str, Any]) -> str:
    """``RUNNING on node[1-2]``, ``PENDING (Resources)``: :func:`job_info`'s state as ``JobState.describe`` says it."""
    reason = f" ({info['reason']})" if info.get("reason") else ""
    where = f" on {info['nodes']}" if info.get("nodes") and not reason else ""
    return f"{info['state']}{reason}{where}"
