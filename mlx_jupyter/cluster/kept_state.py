"""A restart that keeps the ranks' state, from the notebook's side: each old rank saves its user
names into a file on its own host (:mod:`mlx_jupyter.cluster.rank.keep`), the new rank of the same
number restores them, and one line says what was kept and what was not, and why.

No data passes through the notebook: it only chooses the folder's random name and reads the
ranks' short answers.
"""

from __future__ import annotations

import secrets
import sys
import time
from typing import TYPE_CHECKING, Any, Callable, Optional, Protocol

from mlx_jupyter.cluster.cells.text import rank_label
from mlx_jupyter.cluster.keep_cleanup import remove_on_hosts
from mlx_jupyter.cluster.rank import keep_files
from mlx_jupyter.cluster.restart_report import report_line
from mlx_jupyter.cluster.shard_restore import ShardReload, reload_dead
from mlx_jupyter.cluster.shared.errors import ClusterError
from mlx_jupyter.cluster.shared.units import format_bytes
from mlx_jupyter.vocab.hosts import is_local

if TYPE_CHECKING:
    from mlx_jupyter.cluster.cells.cell_server import CellServer
    from mlx_jupyter.cluster.controller_link import ControllerLink
    from mlx_jupyter.cluster.namespaces import RankNamespaces
    from mlx_jupyter.cluster.peer_restore import PeerCopy
    from mlx_jupyter.cluster.processes import ClusterProcesses
    from mlx_jupyter.cluster.rank_control import RankControl
    from mlx_jupyter.cluster.rank_table import RankTable
    from mlx_jupyter.cluster.restart_context import RestartContext
    from mlx_jupyter.cluster.state_records import StateRecords
    from mlx_jupyter.cluster.supervision import Supervisor
    from mlx_jupyter.net.ssh import SSHOptions


class KeepHost(Protocol):
    """What a keep-state restart uses of the cluster it restarts (:class:`~mlx_jupyter.cluster.cluster.Cluster`)."""

    @property
    def cluster_id(self) -> str: ...
    @property
    def context(self) -> "RestartContext": ...
    @property
    def local(self) -> bool: ...
    @property
    def size(self) -> int: ...
    @property
    def ssh_options(self) -> "Optional[SSHOptions]": ...
    @property
    def cell_server(self) -> "Optional[CellServer]": ...
    @property
    def records(self) -> "StateRecords": ...
    @property
    def table(self) -> "RankTable": ...
    @property
    def link(self) -> "ControllerLink": ...
    @property
    def control(self) -> "RankControl": ...
    @property
    def supervisor(self) -> "Supervisor": ...
    @property
    def namespaces(self) -> "RankNamespaces": ...
    @property
    def processes(self) -> "ClusterProcesses": ...


def rank_error_line(exc: BaseException) -> str:
    """A rank's error as one line, its own type and message (not ipyparallel's wrapper's)."""
    elist = getattr(exc, "elist", None)   # ipyparallel's CompositeError: (ename, evalue, tb, info) per engine
    if elist:
        name, value = elist[0][0], elist[0][1]
    else:
        name, value = getattr(exc, "ename", type(exc).__name__), getattr(exc, "evalue", str(exc))
    text = str(value or "").strip().splitlines()
    return f"{name}: {text[0][:160]}" if text else str(name)


class KeptState:
    """One keep-state restart of ``cluster``: :meth:`save` on the old ranks, :meth:`restore` on the
    new, :meth:`cleanup` on every path (success, failure, interrupt), :meth:`failure` the message."""

    def __init__(self, cluster: KeepHost, timeout: float = 120.0) -> None:
        self.cluster = cluster
        self.timeout = timeout
        self.dirname = keep_files.folder_name(cluster.cluster_id, secrets.token_hex(8))
        self.saved: dict[int, dict[str, Any]] = {}
        self.lost: dict[int, str] = {}
        self.restored: dict[int, dict[str, Any]] = {}
        self.hosts: dict[int, str] = {}          # rank -> its host (as reached), for the ranks asked to save
        self.stale: dict[str, list[str]] = {}    # host -> folders there whose owner (on this host) is gone
        self.phase = "saving"                    # then "restarting", "restoring", "done"
        self.left: dict[str, str] = {}           # host -> why its folder could not be removed
        self.stopped_cells = 0                   # cells still running that were stopped first
        self.still_busy: list[int] = []          # ranks whose cell did not stop
        self.imported: dict[int, list[str]] = {}  # rank that kept nothing -> the others' imports it got
        self.died: list[int] = []                 # the ranks that had died: their peers' alike names
        self.all_hosts: dict[int, str] = {}       # rank -> its host, the dead ones too
        self.peers: Optional[PeerCopy] = None     # what the dead ranks got
        self.own: dict[int, dict[str, Any]] = {}            # dead rank -> what its own per-cell record gave back
        self.shards: Optional[ShardReload] = None           # the dead ranks' own shards, remade from their folder
        self.cleaned = False

    def _each_rank(self, fn: Callable[..., Any], ranks: list[int], what: str, *args: Any) -> dict[int, Any]:
        """``fn(*args)`` (default ``fn(dirname, rank)``) on every rank at once; see :meth:`_run_plan`."""
        return self._run_plan({r: (fn, list(args or (self.dirname, r))) for r in ranks}, what)

    def _run_plan(self, plan: dict[int, tuple[Callable[..., Any], list[Any]]], what: str) -> dict[int, Any]:
        """Each rank of ``plan`` runs its ``fn(*args)``, all at once; rank -> answer, or the reason
        it gave none: :class:`RankRaised` when the rank's call raised, else a :class:`ClusterError`
        (it died, or did not answer in time). Over the cell channel when it reaches the ranks (no
        controller needed: it may be dead), else through the controller."""
        from mlx_jupyter.cluster import channel_calls

        cell_server = self.cluster.cell_server
        if not plan:
            return {}
        if channel_calls.usable(cell_server, list(plan)):
            answers = channel_calls.call_each(cell_server, plan, self.timeout, lambda: self.cluster.table.dead, what)
            return {r: RankRaised(str(a)) if isinstance(a, channel_calls.CallRaised) else a
                    for r, a in answers.items()}
        link, supervisor = self.cluster.link, self.cluster.supervisor
        pending = {r: link.view([r]).apply_async(fn, *args) for r, (fn, args) in plan.items()}
        answers = {}
        for r, ar in pending.items():
            try:
                answers[r] = supervisor.wait(ar, self.timeout, [r], what)[0]
            except ClusterError as exc:
                answers[r] = ClusterError(str(exc).splitlines()[0])
            except Exception as exc:  # noqa: BLE001 - the rank's own error, as one line
                answers[r] = RankRaised(rank_error_line(exc))
        return answers

    def stop_cells(self, grace: float = 3.0) -> None:
        """Stop the cells still running, as an interrupt would: ours (``--noblock``, another thread)
        and those of other clients (a connected notebook's, on the panel's cluster). A busy rank would
        save only after its cell ends, and a restart is what one does to a hung cell. A rank still
        busy after ``grace`` s keeps nothing (:meth:`save`)."""
        runs = list(self.cluster.supervisor.runs)
        for run in runs:
            run.interrupt("the ranks are being restarted")
        control, table = self.cluster.control, self.cluster.table
        live = [r for r in table.ranks if r not in table.dead]
        if self.cluster.link.controller_gone():   # no control channel: a cell still running ends the save's wait
            self.still_busy = sorted(r for run in runs if not run.wait(grace) for r in run.ranks)
            self.stopped_cells = len(runs)
            return

        def not_idle(ranks: list[int]) -> tuple[list[int], list[int]]:
            """Of ``ranks``, those running a cell, and those silent (their GIL held by native code)."""
            replies = control.replies(1.0, ranks)
            return ([r for r in ranks if r in replies and replies[r].get("executing")],
                    [r for r in ranks if r not in replies and r not in table.dead])

        executing, silent = not_idle(live)
        busy = sorted(executing + silent)
        others = bool(set(executing) - {r for run in runs for r in run.ranks})   # a cell another client sent
        if busy:
            control.send_abort("the ranks are being restarted", busy)
        deadline = time.monotonic() + grace
        while busy and time.monotonic() < deadline:
            time.sleep(0.1)   # the abort's effect shows only in the ranks' next status
            busy = sorted(sum(not_idle(busy), []))
        self.still_busy = busy
        for run in runs:
            run.wait(max(0.0, deadline - time.monotonic()) + 0.5)
        self.stopped_cells = len(runs) + int(others)

    def save(self) -> None:
        """Every live rank saves its names; a dead, busy or silent rank keeps nothing (and says why)."""
        from mlx_jupyter.cluster.rank import keep

        keep_files.sweep_stale()   # this host's folders of restarts whose driver is gone
        table = self.cluster.table
        for r in table.ranks:
            if r in table.dead:
                self.lost[r] = "the rank had died"
            elif r in self.still_busy or (r in table.busy and not table.busy[r].done()):
                self.lost[r] = ("it was still busy with a cell that did not stop, or did not answer: "
                                "native code, perhaps")
        alive = [r for r in table.ranks if r not in self.lost]
        self.all_hosts = {i.rank: i.host for i in self.cluster.processes.rank_infos()}
        self.hosts = {r: h for r, h in self.all_hosts.items() if r in alive}
        self.died = [r for r in table.ranks if r in table.dead]
        from mlx_jupyter.cluster.rank import peer_copy

        saver = peer_copy.save_digested if self.died and alive else keep.save   # digests only when needed
        failed = {}
        for r, answer in self._each_rank(saver, alive, "saving the ranks' names").items():
            if isinstance(answer, RankRaised):   # it cannot save (no room...): its names would be lost
                failed[r] = str(answer)
            elif isinstance(answer, ClusterError):   # it died or hangs: a restart is the way out
                self.lost[r] = f"saving failed: {answer}"
            else:
                self.saved[r] = answer
                self._note_stale(r, answer.get("others", []))
        if failed:   # a live rank's names would be lost: restart nothing
            raise ClusterError("; ".join(f"rank {r}: {why}" for r, why in sorted(failed.items())))
        self._peers_for_the_dead_while_saving(saver)

    def _peers_for_the_dead_while_saving(self, saver: Callable[..., Any]) -> None:
        """Ranks that died while saving are dead ranks too: their peers give them the names they held alike,
        which needs the survivors' digests (saved again with them if the first save had none)."""
        from mlx_jupyter.cluster.rank import peer_copy

        table = self.cluster.table
        newly = [r for r in table.ranks if r in table.dead and r not in self.died and r in self.lost]
        if not newly or not self.saved:
            return
        self.died = sorted(set(self.died) | set(newly))
        for r in newly:
            self.lost[r] = "the rank died while saving its names"
        if saver is peer_copy.save_digested:
            return
        for r, answer in self._each_rank(peer_copy.save_digested, sorted(self.saved),
                                         "saving the ranks' names with digests").items():
            if isinstance(answer, ClusterError):
                self.lost[r] = f"saving failed: {answer}"
                self.saved.pop(r)
            elif not isinstance(answer, RankRaised):
                self.saved[r] = answer

    def _note_stale(self, rank: int, names: list[str]) -> None:
        """Of the folders another host's rank saw there, those this host's gone processes left."""
        host = self.hosts.get(rank)
        if host is None or is_local(host):
            return   # this host's own were swept above
        gone = [n for n in names if (o := keep_files.owner_of(n)) is not None and keep_files.owner_gone(o)]
        if gone:
            self.stale[host] = sorted(set(self.stale.get(host, [])) | set(gone))

    def restore(self) -> str:
        """The new ranks read their old rank's names; the one-line report. A dead rank's copy from
        its peers runs beside the live ranks' own restore (the peers' files stay until both are
        done), then its own record (:mod:`.state_records`) fills in what the peers could not give."""
        from mlx_jupyter.cluster.rank import keep

        self.phase = "restoring"
        self._form_new_groups()
        plan: dict[int, tuple[Callable[..., Any], list[Any]]] = {}
        if self.died and self.saved:
            from mlx_jupyter.cluster.peer_restore import plan_dead

            try:
                self.peers, plan = plan_dead(self, self.died, self.all_hosts)
            except Exception as exc:  # noqa: BLE001 - costs only the dead ranks' names, not the others'
                self.peers, plan = None, {}
                for r in self.died:
                    self.lost[r] += f"; the copy from its peers failed: {type(exc).__name__}: {exc}"
        sources = sorted({args[1] for fn, args in plan.values()})   # live ranks whose files a dead rank reads
        for r in sorted(self.saved):
            plan[r] = (keep.restore, [self.dirname, r, None, r not in sources])
        answers = self._run_plan(plan, "restoring the ranks' names")
        if self.peers is not None:
            self.peers.note({r: a for r, a in answers.items() if r in self.died})
            for r, why in self.peers.errors.items():
                self.lost[r] += f"; the copy from its peer failed: {why}"
        for r in sorted(self.saved):
            answer = answers[r]
            if isinstance(answer, ClusterError):
                self.lost[r] = f"restoring failed: {answer}"
                self.saved.pop(r, None)
            else:
                self.restored[r] = answer
        if sources:
            self._each_rank(keep.discard, [r for r in sources if r in self.restored], "removing the saved files")
        self.shards = reload_dead(self, self.died) if self.saved else None
        self._restore_own_records()
        self._import_on_lost_ranks()
        self._sweep_remote_stale()
        self.phase = "done"
        if not self.saved and not self.lost:   # e.g. after a restart whose new ranks failed to start
            return f"restart: {self.cluster.size} ranks started empty (no rank was running to keep names from)"
        peer_got = set(self.peers.got) if self.peers else set()
        came = peer_got | {r for r in self.died if self.shards is not None and self.shards.reloaded(r)}
        own = {r for r, a in self.own.items() if a.get("restored") or a.get("imports")}
        clauses = [self._dead_clause(r) for r in self.died if r in peer_got | own]
        clauses += [c for r in self.died if self.shards is not None for c in
                    self.shards.clauses(r, self.all_hosts.get(r, "its host"), self.own.get(r, {}).get("restored"))]
        line = report_line(self.saved, self.restored,
                           {r: why for r, why in self.lost.items() if r not in came | own},
                           self.imported, clauses or None)
        if self.stopped_cells:
            line += f" (after stopping the cell{'s' if self.stopped_cells > 1 else ''} still running)"
        return line

    def _restore_own_records(self) -> None:
        """Each dead rank binds what its own per-cell record holds and its peers did not give."""
        records = self.cluster.records
        if not records.hosts or not self.died:
            return
        from mlx_jupyter.cluster.rank import state_record

        plan = {}
        for r in self.died:
            got = self.peers.got.get(r, {}) if self.peers else {}
            mine = self.shards.reloaded(r) if self.shards is not None else []
            plan[r] = (state_record.restore, [records.dirname, r, list(got.get("restored", [])) + mine])
        for r, answer in self._run_plan(plan, "restoring a dead rank's names from its own record").items():
            if isinstance(answer, ClusterError):
                self.lost[r] += f"; its own record could not be read: {answer}"
            elif answer.get("cell") is not None:
                self.own[r] = answer

    def _dead_clause(self, rank: int) -> str:
        """The report's words for a dead rank that got names from its peers, its own record, or both."""
        from mlx_jupyter.cluster.peer_restore import own_clause

        own = self.own.get(rank)
        if self.peers is not None and rank in self.peers.got:
            return self.peers.clause(rank, own)
        return own_clause(rank, own or {})

    def _import_on_lost_ranks(self) -> None:
        """A rank that kept nothing (it had died, or was stuck) gets the imports the others had, so
        that the next cell fails on it only for the data it lost, not for ``np``."""
        votes: dict[str, set[str]] = {}
        for s in self.saved.values():
            for name, module in s.get("modules", {}).items():
                votes.setdefault(name, set()).add(module)
        modules = {n: next(iter(m)) for n, m in votes.items() if len(m) == 1}
        lost = [r for r in sorted(self.lost) if r not in self.restored and r not in (self.peers.got if self.peers else {})
                and r not in self.own]
        if not modules or not lost:
            return
        from mlx_jupyter.cluster.rank import keep

        for r, answer in self._each_rank(keep.import_modules, lost, "importing on the ranks that kept nothing",
                                         modules).items():
            if not isinstance(answer, ClusterError) and answer.get("restored"):
                self.imported[r] = sorted(answer["restored"])

    def _form_new_groups(self) -> None:
        """A kept name holds MLX's world or our core's group: form the new ones first, on every rank
        (as the next cell would); if they do not form, only those names fail to come back."""
        if not any(s.get("needs") or s.get("shards") for s in self.saved.values()):
            return
        try:
            self.cluster.namespaces.prepare()
        except ClusterError:
            pass

    def _sweep_remote_stale(self) -> None:
        """Stale folders on other hosts, removed by a new rank there (only when there are any)."""
        for host, names in list(self.stale.items()):
            rank = next((r for r, h in self.hosts.items() if h == host and r in self.restored), None)
            if rank is None or not names:
                continue
            answer = self._each_rank(keep_files.remove_folders, [rank], "removing stale folders", names)[rank]
            if not isinstance(answer, ClusterError):
                self.stale[host] = [n for n in names if n not in answer]

    def cleanup(self) -> None:
        """Remove what is left of the folder on every host (the ranks that restored removed their
        own files), and the stale folders not removed yet; what could not be removed is in ``left``."""
        if self.cleaned:
            return
        self.cleaned = True
        by_host: dict[str, list[str]] = {h: list(n) for h, n in self.stale.items() if n}
        done = set(self.restored)
        for r, host in self.hosts.items():
            if r not in done or is_local(host):
                by_host.setdefault(host, [])
                if self.dirname not in by_host[host]:
                    by_host[host].append(self.dirname)
        if self.cluster.local:
            keep_files.remove_all(self.dirname)
        self.left = remove_on_hosts(by_host, self.cluster.ssh_options)

    def origins(self) -> dict[int, str]:
        """Rank -> where its names came from at this restart (``%mlx_cluster status`` shows it)."""
        from mlx_jupyter.cluster.peer_restore import PeerCopy

        out = (self.peers or PeerCopy()).origins(list(self.cluster.table.ranks), list(self.restored), self.own)
        return self.shards.origins(out) if self.shards is not None else out

    def failure(self, exc: BaseException) -> str:
        """What a restart that ended with ``exc`` kept and lost, and what to do next (cleanup first)."""
        step = {"saving": "saving the ranks' names", "restarting": "starting the new ranks",
                "restoring": "restoring the names"}.get(self.phase, self.phase)
        if isinstance(exc, KeyboardInterrupt):
            head = f"interrupted while {step}"
        else:
            head = f"{step} failed ({(str(exc).strip().splitlines() or [type(exc).__name__])[0]})"
        names = sorted({n for s in self.saved.values() for n in s.get("kept", [])})
        size = format_bytes(sum(s.get("bytes", 0) for s in self.saved.values()))
        if self.phase == "saving":
            what = "nothing was lost: the ranks were not restarted and keep their names"
        elif self.phase == "restarting":
            saved = f"{len(names)} name{'' if len(names) == 1 else 's'} saved on {len(self.saved)} " \
                    f"rank{'' if len(self.saved) == 1 else 's'} ({size})"
            what = f"lost: the {saved}, as the old ranks are gone; the saved files were removed"
        else:
            back = sorted(self.restored)
            what = (f"kept: the names restored on {rank_label(back)}; lost: the rest, and the saved files were removed"
                    if back else "lost: the saved names (none was restored); the saved files were removed")
        left = "; ".join(f"could not remove {self.dirname} on {h} ({why}): remove it by hand"
                         for h, why in sorted(self.left.items()))
        context = self.cluster.context   # restart_context.RestartContext: what works where it is shown
        nxt = context.after_unstarted_restart() if self.phase == "saving" else context.after_failed_restart()
        return f"{head}; {what}{'; ' + left if left else ''}. Next: {nxt}"


class RankRaised(ClusterError):
    """A rank's own error in a restart step (not its death or silence)."""


class RestartNotStarted(ClusterError):
    """A keep-state restart that failed before it stopped any rank: the ranks run on, names intact."""


def restart_keeping(cluster: KeepHost, restart: Callable[[], None], timeout: Optional[float] = None,
                    origins: Optional[dict[int, str]] = None) -> str:
    """Save, ``restart()`` the processes, restore; the report line (``origins`` gets where each rank's
    names came from). The folders are removed on every path; a failure raises :class:`ClusterError`
    saying what was kept and lost and what to do (an interrupt prints that line and goes on as an interrupt)."""
    state = KeptState(cluster, timeout or 120.0)
    try:
        state.stop_cells()
        state.save()
        state.phase = "restarting"
        restart()
        line = state.restore()
        if origins is not None:
            origins.update(state.origins())
        return line
    except BaseException as exc:
        state.cleanup()
        message = state.failure(exc)
        if isinstance(exc, KeyboardInterrupt):
            print(f"mlx-jupyter: {message}", file=sys.stderr)
            raise
        raise (RestartNotStarted if state.phase == "saving" else ClusterError)(message) from exc
    finally:
        state.cleanup()
