"""A controller cell's pdb on this rank: its output and lines pass through ``mlx_debug_request`` (control channel)."""

from __future__ import annotations

import sys
import threading
import time
from collections import OrderedDict, deque
from typing import Any, Optional

#: said where a controller cell's pdb was asked for by nobody (%px, Cluster.execute, a --noblock run)
SKIPPED_CONTROL = ("breakpoint() skipped: this cell came through the controller and its sender does not show pdb "
                   "prompts (%px, Cluster.execute, a --noblock run; a %%mlx_distributed cell does); after an error, "
                   "%mlx_debug --all -c \"p x\" works from anywhere")


#: seconds a pdb of a controller cell waits for its notebook's first ``mlx_debug_request`` (a connected
#: notebook asks from 0.25 s into the cell on; ``%px`` and ``Cluster.execute`` never do)
CONTACT = 5.0


class ControlPort:
    """One controller cell's pdb ends on this rank: what pdb writes waits for the notebook's next
    ``mlx_debug_request`` (control thread), whose ``line`` is pdb's next line (main thread)."""

    def __init__(self, rank: int | str, cell_id: str, contact: float = CONTACT):
        self.rank = rank
        self.cell_id = cell_id
        self.contact = contact
        self._cond = threading.Condition()
        self._lines: deque[Optional[str]] = deque()
        self._outbox: list[dict[str, Any]] = []
        self.asked = False  # the notebook asked about this cell: someone drives the prompt

    def post(self, msg: dict[str, Any]) -> None:
        with self._cond:
            self._outbox.append(msg)

    def drop_debug_lines(self) -> None:
        with self._cond:
            self._lines.clear()

    def wait_debug_line(self) -> Optional[str]:
        """The notebook's next line (None: it cannot prompt, or nobody asked within ``contact`` s). Waits in
        short steps: Ctrl-C (an abort's SIGINT) ends it."""
        deadline = time.monotonic() + self.contact
        with self._cond:
            while not self._lines:
                if not self.asked and time.monotonic() >= deadline:
                    print(f"{SKIPPED_CONTROL} (nothing asked for the prompt within {self.contact:g} s)",
                          file=sys.stderr)
                    return None
                self._cond.wait(0.25)
            return self._lines.popleft()

    def request(self, content: dict[str, Any]) -> dict[str, Any]:
        """An ``mlx_debug_request`` (control thread): its ``line`` queued for pdb; what pdb wrote since the last."""
        with self._cond:
            self.asked = True
            if "line" in content:
                line = content.get("line")
                self._lines.append(None if line is None else str(line))
                self._cond.notify_all()
            msgs, self._outbox = self._outbox, []
        return {"status": "ok", "msgs": msgs}


_PORTS: "OrderedDict[str, ControlPort]" = OrderedDict()  # the last few controller cells' ports, by request id
_PORTS_LOCK = threading.Lock()
_RANK: int | str = "?"


def control_port(cell_id: str) -> ControlPort:
    """The port of controller cell ``cell_id`` (made at its first use: a request may come before pdb starts)."""
    with _PORTS_LOCK:
        port = _PORTS.get(cell_id)
        if port is None:
            port = _PORTS[cell_id] = ControlPort(_RANK, cell_id)
            while len(_PORTS) > 4:  # a stale request of an ended cell must not drop the running cell's port
                _PORTS.popitem(last=False)
        return port


def _on_debug_request(kernel: Any, stream: Any, idents: Any, parent: dict[str, Any]) -> None:
    """``mlx_debug_request {cell, line?}`` on the control channel: see :class:`ControlPort`."""
    content = parent.get("content") or {}
    cell = str(content.get("cell") or "")
    reply = control_port(cell).request(content) if cell else {"status": "ok", "msgs": []}
    kernel.session.send(stream, "mlx_debug_reply", reply, parent=parent, ident=idents)


def answer_requests(kernel: Any, rank: int | str) -> None:
    """Answer ``mlx_debug_request`` on ``kernel``'s control channel; ports made from now on are ``rank``'s."""
    global _RANK
    _RANK = rank
    kernel.control_handlers["mlx_debug_request"] = lambda *a: _on_debug_request(kernel, *a)
