"""The Stop of a reply, at the same token on every rank (rank side).

The notebook sends :data:`MSG_TYPE` ``{reply}`` to every rank's control channel, which the
kernel answers on its control thread while the reply's cell runs. Between two tokens every rank
adds whether it has seen it (:func:`agreed`), so all of them end the reply after the same token:
the collectives the model has already queued are the same everywhere, and ``world`` stays usable.
"""

from __future__ import annotations

import threading
from typing import Any, Optional

MSG_TYPE = "mlx_chat_stop_request"

_lock = threading.Lock()
_stopped: set[str] = set()


def install(kernel: Optional[Any] = None) -> bool:
    """Answer :data:`MSG_TYPE` in this rank's kernel (default: the running one); whether there is one."""
    if kernel is None:
        from IPython import get_ipython

        shell = get_ipython()
        kernel = getattr(shell, "kernel", None)
    handlers = getattr(kernel, "control_handlers", None)
    if handlers is None:
        return False
    handlers[MSG_TYPE] = lambda stream, idents, parent: _on_stop(kernel, stream, idents, parent)
    return True


def _on_stop(kernel: Any, stream: Any, idents: Any, parent: dict[str, Any]) -> None:
    """A stop request (the control thread): note its reply id, answer at once."""
    reply = str(parent.get("content", {}).get("reply", ""))
    request(reply)
    kernel.session.send(stream, "mlx_chat_stop_reply", {"status": "ok", "reply": reply}, parent=parent, ident=idents)


#: stops kept for replies that have not begun here (a stop that came after its reply's end is never spent)
KEEP = 64


def request(reply: str) -> None:
    """Ask this rank to stop ``reply`` (whether it has begun here or not)."""
    with _lock:
        if len(_stopped) >= KEEP:
            _stopped.clear()
        _stopped.add(reply)


def requested(reply: str) -> bool:
    """Whether this rank was asked to stop ``reply``."""
    with _lock:
        return reply in _stopped


def forget(reply: str) -> None:
    """``reply`` ended on this rank: its stop, if any, is spent."""
    with _lock:
        _stopped.discard(reply)


def agreed(local: bool, core_group: Any = None, world: Any = None, stream: Any = None) -> bool:
    """Whether any rank asks to stop, the same answer on every rank: one small sum over our core's
    ``core_group`` (beside MLX's queued work), else over MLX's ``world`` on ``stream``, the stream
    the model's own collectives run on (so every rank runs them in the same order)."""
    if core_group is not None:
        import numpy as np

        from mlx_jupyter import distributed

        return bool(distributed.all_sum(np.array([int(local)], dtype=np.int32), group=core_group)[0])
    import mlx.core as mx

    return bool(mx.distributed.all_sum(mx.array([int(local)]), group=world, stream=stream).item())
