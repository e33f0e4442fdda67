"""What runs inside each rank's engine: `mx`/`world`/`group`, and the way out of a stuck cell.

A :class:`RankAgent` is installed in every engine started by
:mod:`mlx_jupyter.cluster.rank.engine`. It answers two control-channel requests, which the
engine's control thread handles even while a cell blocks the main thread:

- ``mlx_abort_request {reason, msg_id, drain}``: interrupt the running cell (SIGINT: Python
  code stops at its next bytecode; an op of our core stops too, and aborts its group,
  which fails the peers' ops at once). A cell still frozen in native code waits for the
  notebook's drain (:mod:`~mlx_jupyter.cluster.rank.drain`), else, or after ``grace`` s
  without one, MLX's world sockets are closed: a blocked ring op raises "connection to a
  peer was lost". The world group is then unusable until the ranks restart: from then on a
  cell that uses it is refused with one line (:class:`~.names.WorldGuard`). A rank that
  was only running Python keeps its groups: an abort kills no group by itself.
  The SIGINT names its cell (:mod:`~mlx_jupyter.cluster.rank.interrupt`).
  An abort naming a cell (``msg_id``) that has not started here yet (its request
  still queued, or between dispatch and ``pre_run_cell``) keeps that cell from
  running: the kernel answers "aborted", or the cell is rejected before its
  first line (:class:`CellAborted`).
- ``mlx_status_request``: pid, memory, whether a cell runs and since when, group/world state.

Requests that run functions (``apply_request``: setup, push, pull) are tracked
like cells, so an abort naming one (the notebook's KeyboardInterrupt) stops it too
(:mod:`~mlx_jupyter.cluster.rank.apply_tracking`).

A cell that raises by itself is left to its supervisor when it has one (a
``%%mlx_distributed`` cell: the notebook releases the ranks still running, and decides
what to form again from what the ranks say). A cell nobody supervises (``%px``,
``view.execute``) that raises while running aborts the product's core group at once, so
peers blocked in our collectives are released, and tells its peers' agents
(:mod:`~mlx_jupyter.cluster.rank.peers`): each one still running the same request stops it
as an abort would, closing MLX's world sockets under a blocked MLX collective. A cell that
never ran (a SyntaxError) aborts nothing.
"""

from __future__ import annotations

import ast
import collections
import os
import socket
import threading
import time
from typing import Any, Optional

from IPython.core.error import InputRejected

from mlx_jupyter.cluster.rank import cell_end, drain
from mlx_jupyter.cluster.rank.apply_tracking import tracked_apply
from mlx_jupyter.cluster.rank.interrupt import CellInterrupt
from mlx_jupyter.cluster.rank.kernel_compat import check_kernel
from mlx_jupyter.cluster.rank.names import NAMES, WorldGuard
from mlx_jupyter.cluster.rank.peers import PeerLink, open_link, request_key, same_request
from mlx_jupyter.cluster.rank.process import configure_output, rss
from mlx_jupyter.models.shard_recipe import record_when_imported
from mlx_jupyter.cluster.rank.sockets import shutdown_sockets, world_socket_fds
from mlx_jupyter.cluster.shared.wire import CHANNEL_SESSION
from mlx_jupyter.cluster.shared.zmqwatch import watch_queues
from mlx_jupyter.vocab import rank_env
from mlx_jupyter.vocab.rank_env import RankEnv

#: the label our cell runs give the cells they send through the controller (ipp_compat.send_execute)
SUPERVISED_LABEL = "mlx_distributed"

#: the agent of this process, once installed
AGENT: Optional["RankAgent"] = None
#: why the agent could not be installed (set by :mod:`mlx_jupyter.cluster.rank.engine`)
AGENT_ERROR = ""

class CellAborted(InputRejected):
    """A cell aborted before it started on this rank; it did not run."""


class _RejectCell(ast.NodeTransformer):
    """Installed for one aborted cell only: rejects it before its first line runs."""

    def __init__(self, agent: "RankAgent", cell: int, reason: str):
        self.agent, self.cell, self.reason = agent, cell, reason

    def visit(self, node: ast.AST) -> ast.AST:
        self.agent._drop_rejector(self)
        if self.agent.cell == self.cell:
            raise CellAborted(f"not run: {self.reason}")
        return node


class RankAgent:
    """One rank's side of the no-hang promise. See the module docstring."""

    def __init__(self, kernel: Any, rank: int, grace: float = 0.3, env: Optional[RankEnv] = None):
        self.kernel = kernel
        self.shell = kernel.shell
        self.rank = rank
        #: this rank's environment, read once (the engine reads it; default: this process's)
        self.env = env if env is not None else rank_env.current()
        self.backend = self.env.backend
        self._lock = threading.Lock()
        self.executing = False
        self.kind = "cell"  # of the current (or last) request: "cell" or "apply"
        self.returned = False  # the current apply request's handler has returned
        self.cell = 0
        self.cell_started: Optional[float] = None  # wall clock (time.time()) the current request began
        self._begun = 0.0  # time.monotonic() of the same moment
        self.abort_reason: Optional[str] = None
        self.world_sockets: dict[int, int] = {}
        self.world_closed = ""
        self.last_error = ""
        self.msg_id = ""  # the request of the current (or last) cell
        self._ended_ids: collections.deque[str] = collections.deque(maxlen=64)
        self._not_started: "collections.OrderedDict[str, str]" = collections.OrderedDict()
        self._not_started_at: dict[str, int] = {}   # such a request -> the cell count when its abort came
        self._rejector: Optional[_RejectCell] = None
        self.queue_kicks = 0  # requests found waiting in the shell socket by the watch
        self._silent_cell = False  # a silent cell is running (begun by pre_execute, not pre_run_cell)
        self._numbered = False  # the running cell is named with the notebook's number (number_cells_as)
        self.peers: Optional[PeerLink] = None  # the link to the peers' agents, once installed
        #: (request key, reason, when) of peers' raised requests: one not begun here yet never runs
        self._peer_notices: collections.deque[tuple[dict[str, Any], str, float]] = collections.deque(maxlen=16)
        self.interrupt = CellInterrupt(self, self._lock, self.shell, _ENDING_CODES, grace)
        self.gate = drain.Gate()  # a frozen cell waits here for the notebook's drain

    # ------------------------------------------------------------ install

    def install(self) -> None:
        self.shell.events.register("pre_run_cell", self._pre_run_cell)
        self.shell.events.register("post_run_cell", self._post_run_cell)
        # a silent execute_request (ipyparallel's view.execute default) triggers only these two
        self.shell.events.register("pre_execute", self._pre_execute)
        self.shell.events.register("post_execute", self._post_execute)
        self.kernel.control_handlers["mlx_abort_request"] = self._on_abort
        self.kernel.control_handlers["mlx_status_request"] = self._on_status
        self.kernel.control_handlers.update(drain.handlers(self))
        handlers = self.kernel.shell_handlers
        if "apply_request" in handlers:
            handlers["apply_request"] = tracked_apply(self, handlers["apply_request"])
        configure_output(self.shell)
        record_when_imported()   # a model mlx_lm.utils.sharded_load gives carries its recipe (issue 43 §4)
        self.shell.ast_transformers.append(WorldGuard(self.shell.user_ns))
        stream = getattr(self.kernel, "shell_stream", None)
        if stream is not None:
            watch_queues([stream], self._kicked)
        ring_rank = self.env.rank if self.env.rank is not None else self.rank
        key = getattr(getattr(self.kernel, "session", None), "key", b"") or b""
        self.peers = open_link(ring_rank, self.env.mlx_hostfile, key, self._on_peer_raised)

    def _kicked(self, stream: Any) -> None:
        self.queue_kicks += 1

    # ------------------------------------------------------------ cells

    def _parent(self) -> dict[str, Any]:
        get_parent = getattr(self.kernel, "get_parent", None)
        try:
            return (get_parent("shell") if get_parent else {}) or {}
        except Exception:
            return {}

    def _parent_msg_id(self) -> str:
        return str(self._parent().get("header", {}).get("msg_id", ""))

    def _supervised(self) -> bool:
        """Whether the current cell came from a supervised run (the cell channel, or our label)."""
        parent = self._parent()
        return (parent.get("header", {}).get("session") == CHANNEL_SESSION
                or (parent.get("metadata") or {}).get("label") == SUPERVISED_LABEL)

    def _begin(self, msg_id: str, kind: str = "cell") -> Optional[str]:
        """A request starts on the main thread; the abort reason if it was aborted before it started."""
        with self._lock:
            self.executing = True
            self.kind = kind
            self.cell += 1
            self.cell_started = time.time()
            self._begun = time.monotonic()
            self.msg_id = msg_id
            reason = self._not_started.pop(msg_id, None) if msg_id else None
            if reason is None and self._peer_notices and kind == "cell":
                reason = self._peer_raised_reason()
            self.abort_reason = reason
            if reason is not None and kind == "cell":
                self._rejector = _RejectCell(self, self.cell, reason)
                self.shell.ast_transformers.insert(0, self._rejector)
        if reason is not None:
            aborted = getattr(self.kernel, "aborted", None)
            if aborted is not None:
                aborted.discard(msg_id)
        self.interrupt.begin()
        return reason

    def never_began(self, msg_id: str) -> bool:
        """Whether the request ``msg_id`` was aborted here before it began, and no request has begun since
        (the rank is idle and owes that run nothing it ran: a drain may have it make the run's calls)."""
        with self._lock:
            return (bool(msg_id) and not self.executing and msg_id in self._not_started
                    and self._not_started_at.get(msg_id) == self.cell)

    def _end(self) -> Optional[str]:
        """The request ended; the reason it was aborted, if it was."""
        with self._lock:
            self.executing = False
            if self.msg_id:
                self._ended_ids.append(self.msg_id)
            return self.abort_reason

    def _pre_run_cell(self, info: Any = None) -> None:
        self._begin(self._parent_msg_id())
        metadata = self._parent().get("metadata") or {}
        number, first = metadata.get("cell_number"), metadata.get("first_line")
        number = number if isinstance(number, int) and number > 0 else 0
        first = first if isinstance(first, int) and first > 1 else 1
        if number or first > 1:   # a notebook's cell through the controller: its In[N], the editor's lines
            from mlx_jupyter.cluster.rank.cell_names import number_cells_as

            number_cells_as(self.shell, number, first)
            self._numbered = True

    def _pre_execute(self) -> None:
        parent = self._parent()
        if (parent.get("content") or {}).get("silent"):
            self._silent_cell = True
            self._begin(str(parent.get("header", {}).get("msg_id", "")))

    def _post_execute(self) -> None:
        if self._silent_cell:
            self._silent_cell = False
            self._post_run_cell(getattr(self.shell, "last_execution_result", None))

    def _drop_rejector(self, rejector: Optional[_RejectCell] = None) -> None:
        with self._lock:
            current = self._rejector
            if current is None or (rejector is not None and current is not rejector):
                return
            self._rejector = None
        try:
            self.shell.ast_transformers.remove(current)
        except ValueError:
            pass

    def _post_run_cell(self, result: Any = None) -> None:
        self._drop_rejector()  # a cell that failed to compile never reached it
        # the per-cell record of this rank's names (opt-in): its number before number_cells_as resets it
        number = cell_end.cell_number(self.shell, result) if cell_end.RECORD is not None else 0
        if self._numbered:
            from mlx_jupyter.cluster.rank.cell_names import number_cells_as

            number_cells_as(self.shell, 0)
            self._numbered = False
        aborted = self._end()
        err = getattr(result, "error_in_exec", None) or getattr(result, "error_before_exec", None)
        record = cell_end.RECORD
        if err is None and aborted is None and number and record is not None:
            record(number)
        if err is None or aborted is not None:
            return
        self.last_error = f"{type(err).__name__}: {err}"
        # a cell that never ran (SyntaxError, refused) left nobody waiting; a supervised one's
        # run releases the others and decides what to form again
        if getattr(result, "error_in_exec", None) is not None and not self._supervised():
            self.abort_group(f"rank {self.rank} raised {self.last_error}")
            self._tell_peers()

    # ------------------------------------------------------------ peers

    def _tell_peers(self) -> None:
        """Tell the peers' agents this request raised (before its reply goes out: no later call has begun)."""
        peers = self.peers
        key = request_key(self._parent()) if peers is not None else None
        if peers is not None and key is not None:
            key["ran"] = time.monotonic() - self._begun  # its peers tell this call from a later one by it
            peers.tell_raised(key, self.last_error)

    def _on_peer_raised(self, rank: int, key: dict[str, Any], error: str) -> None:
        """A peer's unsupervised request raised: stop ours if it is the same call, or keep it from
        running if it has not begun here yet (peer link's thread)."""
        reason = f"rank {rank} raised {error}"
        with self._lock:
            running = self.executing and self.kind == "cell"
            msg_id = self.msg_id
            # under the lock: a request beginning now either sees this notice or is running below
            self._peer_notices.append((key, reason, time.monotonic()))
        if running and not self._supervised() and same_request(request_key(self._parent()), key):
            with self._lock:
                self.interrupt.peer_stopped = self.cell
            self.abort(reason, msg_id)

    def _peer_raised_reason(self, keep: float = 3600.0) -> Optional[str]:
        """Why the request beginning now must not run: a peer raised in the same call (under the lock)."""
        if self._supervised():
            return None
        mine, now = request_key(self._parent()), time.monotonic()
        for key, reason, when in self._peer_notices:
            if now - when < keep and same_request(mine, key):
                return reason
        return None

    # ------------------------------------------------------------ group / world

    def abort_group(self, reason: str) -> None:
        """Abort the product's core group (never one the user made): its peers' ops fail at once."""
        group = NAMES.group
        if group is None:
            return
        try:
            group.abort(reason)
        except Exception:
            pass

    def close_world(self, reason: str) -> bool:
        """Shut down MLX's world sockets so that a blocked MLX collective raises; the world is dead."""
        # a world the cell formed itself (mx.distributed.init in the user's code) was never handed to
        # us: its sockets are this process's sockets on the ring's ports
        closed = shutdown_sockets(self.world_sockets or world_socket_fds({}, self.env.mlx_hostfile))
        if closed:
            self.world_closed = reason
            NAMES.world_is_dead(reason)
        return closed

    # ------------------------------------------------------------ control handlers

    def _reply(self, stream: Any, idents: Any, parent: dict[str, Any], msg_type: str, content: dict[str, Any]) -> None:
        content.setdefault("status", "ok")
        self.kernel.session.send(stream, msg_type, content, parent=parent, ident=idents)

    def abort(self, reason: str, msg_id: str = "", drain: bool = False) -> bool:
        """Stop this rank's cell. Returns whether a cell ran.

        ``msg_id`` names the cell to stop; if it has not started here yet, it never will.
        Without it, whatever cell runs is stopped; one that already ended is left alone. No group is
        aborted here (an op of our core that the interrupt stops aborts its group itself). ``drain``:
        a cell frozen in native code waits for the notebook's drain before MLX's sockets are closed.
        """
        with self._lock:
            running = self.executing and (not msg_id or msg_id == self.msg_id)
            cell = self.cell
            if msg_id and not running and msg_id != self.msg_id and msg_id not in self._ended_ids:
                self._not_started[msg_id] = reason
                self._not_started_at[msg_id] = cell
                while len(self._not_started) > 64:
                    self._not_started_at.pop(self._not_started.popitem(last=False)[0], None)
                aborted = getattr(self.kernel, "aborted", None)
                if aborted is not None:  # still queued: ipyparallel's kernel answers "aborted"
                    aborted.add(msg_id)
            if running:
                self.abort_reason = reason
                # under the lock: the cell cannot end between this check and the signal
                # (its post_run_cell waits for the lock)
                self.interrupt.send(cell)
        if running and (drain or self.world_sockets or self.env.mlx_hostfile) and self.kind == "cell":
            hold = (lambda c: self.gate.hold(c, lambda: self.executing and self.cell == c)) if drain else None
            threading.Thread(target=self.interrupt.release_native, args=(cell, reason, hold), daemon=True).start()
        return running

    def _on_abort(self, stream: Any, idents: Any, parent: dict[str, Any]) -> None:
        reason = parent["content"].get("reason", "aborted")
        running = self.abort(reason, str(parent["content"].get("msg_id") or ""), bool(parent["content"].get("drain")))
        self._reply(stream, idents, parent, "mlx_abort_reply", {"was_running": running, "rank": self.rank})

    def status(self) -> dict[str, Any]:
        return {
            "rank": self.rank,
            "pid": os.getpid(),
            "host": socket.gethostname(),
            "rss": rss(),
            "executing": self.executing,
            "cell": self.cell,
            "cell_started": self.cell_started if self.executing else None,
            "time": time.time(),
            "backend": self.backend,
            "world": NAMES.world is not None,
            "world_closed": self.world_closed,
            "world_dead": NAMES.world_dead,
            "group": NAMES.group is not None,
            "group_aborted": NAMES.group_aborted(),
            "last_error": self.last_error,
            "queue_kicks": self.queue_kicks,
        }

    def _on_status(self, stream: Any, idents: Any, parent: dict[str, Any]) -> None:
        self._reply(stream, idents, parent, "mlx_status_reply", self.status())


#: frames in which a SIGINT the agent sent comes too late: the request's own code is done
_ENDING_CODES = frozenset({RankAgent._post_run_cell.__code__, RankAgent._end.__code__})


def install(kernel: Any, rank: int, env: Optional[RankEnv] = None) -> RankAgent:
    """Create and install this process's agent (called by :mod:`mlx_jupyter.cluster.rank.engine`).

    Raises RuntimeError naming the kernel internals that are missing.
    """
    global AGENT
    check_kernel(kernel)
    AGENT = RankAgent(kernel, rank, env=env)
    AGENT.install()
    return AGENT


def agent_state() -> dict[str, Any]:
    """Whether this rank's agent is installed, and if not why (the cluster's start-up probe)."""
    import ipyparallel

    from mlx_jupyter.cluster.rank import channel

    if AGENT is not None:
        return {"installed": True, "ipyparallel": ipyparallel.__version__,
                "channel": channel.CHANNEL is not None and channel.CHANNEL.connected.is_set(),
                "channel_error": channel.ERROR or (channel.CHANNEL.error if channel.CHANNEL else "")}
    return {"installed": False, "ipyparallel": ipyparallel.__version__,
            "error": AGENT_ERROR or "the engine never installed it (IPEngine.complete_registration was not called)"}


#: start's probe, run as an ``execute_request``: its reply needs no pickling, so the rank
#: does not import numpy on start's path (ipyparallel's canning does, on a first ``apply``)
PROBE_CODE = "__import__('mlx_jupyter.cluster.rank.agent', fromlist=['_']).require_agent()"


def require_agent() -> None:
    """Raise RuntimeError holding :func:`agent_state` as JSON unless this rank's agent is installed."""
    state = agent_state()
    if not state["installed"]:
        import json

        raise RuntimeError(json.dumps(state))
