"""An engine's ``apply_request`` handler tracked like a cell, so that an abort naming it stops it."""

from __future__ import annotations

import inspect
from typing import Any, Awaitable, Callable, Optional, Protocol

from mlx_jupyter.cluster.rank.kernel_compat import send_abort_reply


class Tracker(Protocol):
    """What the tracking uses of the rank's agent (:class:`~.agent.RankAgent`)."""

    kernel: Any
    returned: bool

    def _begin(self, msg_id: str, kind: str = "cell") -> Optional[str]: ...

    def _end(self) -> Optional[str]: ...


def tracked_apply(agent: Tracker, handler: Callable[..., Any]) -> Callable[..., Any]:
    """``apply_request`` wrapped in the agent's ``_begin``/``_end``, so that an abort naming it stops it.

    One aborted before it began is answered "aborted" (also when our SIGINT
    lands before the handler is called); ipyparallel's handler turns an
    interrupt inside it into an error reply.
    """

    def apply_request(stream: Any, ident: Any, parent: dict[str, Any]) -> Any:
        msg_id = str(parent.get("header", {}).get("msg_id", ""))
        started = awaited = False
        try:
            agent.returned = False
            if agent._begin(msg_id, "apply") is not None:
                return send_abort_reply(agent.kernel, stream, parent, ident)
            started = True
            result = handler(stream, ident, parent)
            if inspect.isawaitable(result):
                awaited = True
                return _finish_later(agent, result)
            agent.returned = True  # a late SIGINT from here on is dropped (CellInterrupt.on_sigint)
            return result
        except KeyboardInterrupt:
            if not started:  # stopped before it ran: it still gets its reply
                return send_abort_reply(agent.kernel, stream, parent, ident)
            return None
        finally:
            if not awaited:
                agent._end()

    apply_request.__wrapped__ = handler  # type: ignore[attr-defined]
    return apply_request


async def _finish_later(agent: Tracker, result: Awaitable[Any]) -> Any:
    try:
        value = await result
        agent.returned = True
        return value
    finally:
        agent._end()
