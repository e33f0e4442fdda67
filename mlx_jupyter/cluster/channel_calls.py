"""The product's own calls to the ranks over the cell channel, from the notebook's side: what a
keep-state restart asks of the ranks (save, restore) goes here, so that it needs no controller
(a dead controller no longer costs the ranks' names). The rank side is
:mod:`mlx_jupyter.cluster.rank.calls`."""

from __future__ import annotations

import threading
import time
import uuid
from typing import TYPE_CHECKING, Any, Callable, Container, Optional, Protocol, Sequence, TypeGuard

from mlx_jupyter.cluster.shared.errors import ClusterError

if TYPE_CHECKING:
    from mlx_jupyter.cluster.cells.cell_server import Sink

#: rank -> (the rank-side function, its arguments)
Plan = dict[int, tuple[Callable[..., Any], list[Any]]]


class CallChannel(Protocol):
    """What a call needs of the direct cell channel (:class:`~mlx_jupyter.cluster.cells.cell_server.CellServer`)."""

    @property
    def session(self) -> object: ...   # None until the cell server has started
    def connected(self, ranks: list[int]) -> bool: ...
    def send_call(self, rank: int, msg_id: str, fn: str, args: list[Any], sink: Sink) -> object: ...


class CallRaised(ClusterError):
    """A rank's own error in a call (not its death or silence), as one line."""


class _Answer:
    """The cell server's sink for one call: its reply, once."""

    def __init__(self) -> None:
        self.content: Optional[dict[str, Any]] = None
        self.event = threading.Event()

    def channel_output(self, rank: int, kind: str, content: dict[str, Any]) -> None:
        pass

    def channel_debug(self, rank: int, text: str, prompt: Optional[str], done: bool) -> None:
        pass

    def channel_reply(self, rank: int, content: dict[str, Any]) -> None:
        self.content = content
        self.event.set()


def usable(cell_server: Optional[CallChannel], ranks: Sequence[int]) -> TypeGuard[CallChannel]:
    """Whether ``cell_server`` (the cluster's, or None) reaches every rank of ``ranks``."""
    return cell_server is not None and cell_server.session is not None and bool(ranks) and cell_server.connected(list(ranks))


def call_ranks(cell_server: CallChannel, fn: Callable[..., Any], calls: dict[int, list[Any]], timeout: float,
               dead: Callable[[], Container[int]], what: str) -> dict[int, Any]:
    """``fn(*args)`` on every rank of ``calls`` (rank -> its args) at once over the channel; see :func:`call_each`."""
    return call_each(cell_server, {r: (fn, args) for r, args in calls.items()}, timeout, dead, what)


def call_each(cell_server: CallChannel, plan: Plan, timeout: float, dead: Callable[[], Container[int]],
              what: str) -> dict[int, Any]:
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
