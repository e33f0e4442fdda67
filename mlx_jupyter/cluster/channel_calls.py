"""The product's own calls to the ranks over the cell channel, from the notebook's side: what a
keep-state restart asks of the ranks (save, restore) goes here, so that it needs no controller
(a dead controller no longer costs the ranks' names). The rank side is
:mod:`mlx_jupyter.cluster.rank.calls`."""

from __future__ import annotations

import threading
import time
import uuid
from typing import Any, Callable, Optional, Sequence

from mlx_jupyter.cluster.shared.errors import ClusterError


class CallRaised(ClusterError):
    """A rank's own error in a call (not its death or silence), as one line."""


class _Answer:
    """The cell_server's sink for one call: its reply, once."""

    def __init__(self) -> None:
        self.content: Optional[dict] = None
        self.event = threading.Event()

    def channel_output(self, rank: int, kind: str, content: dict) -> None:
        pass

    def channel_debug(self, rank: int, text: str, prompt: Optional[str], done: bool) -> None:
        pass

    def channel_reply(self, rank: int, content: dict) -> None:
        self.content = content
        self.event.set()


def usable(cell_server: Any, ranks: Sequence[int]) -> bool:
    """Whether ``cell_server`` (the cluster's, or None) reaches every rank of ``ranks``."""
    return cell_server is not None and cell_server.session is not None and bool(ranks) and cell_server.connected(list(ranks))


def call_ranks(cell_server: Any, fn: Callable[..., Any], calls: dict[int, list], timeout: float,
               dead: Callable[[], Any], what: str) -> dict[int, Any]:
    """``fn(*args)`` on every rank of ``calls`` (rank -> its args) at once over the channel; see :func:`call_each`."""
    return call_each(cell_server, {r: (fn, args) for r, args in calls.items()}, timeout, dead, what)


def call_each(cell_server: Any, plan: dict[int, tuple[Callable[..., Any], list]], timeout: float,
              dead: Callable[[], Any], what: str) -> dict[int, Any]:
    """Each rank of ``plan`` runs its ``fn(*args)``, all at once over the channel; rank -> its
    answer, or a :class:`CallRaised` (its own error), or a :class:`ClusterError` (it died, or took
    longer than ``timeout`` s). ``dead()``: the ranks known dead now."""
    from mlx_jupyter.cluster.rank.calls import name_of

    sinks = {}
    for r, (fn, args) in plan.items():
        sinks[r] = _Answer()
        cell_server.send_call(r, f"call-{uuid.uuid4().hex}", name_of(fn), list(args), sinks[r])
    deadline = time.monotonic() + timeout
    out: dict[int, Any] = {}
    for r, sink in sinks.items():
        while not sink.event.wait(0.05):
            if r in dead():
                out[r] = ClusterError(f"rank {r} died during {what}")
                break
            if time.monotonic() > deadline:
                out[r] = ClusterError(f"{what} did not finish within {timeout:g} s on rank {r}")
                break
        if r in out:
            continue
        content = sink.content or {}
        if content.get("status") == "ok" and "value" in content:
            out[r] = content["value"]
        elif content.get("ename") == "ChannelError":   # the rank's connection is gone: it died, or is cut off
            out[r] = ClusterError(str(content.get("evalue", "")))
        else:
            out[r] = CallRaised(f"{content.get('ename', 'Error')}: {content.get('evalue', '')}".strip())
    return out
