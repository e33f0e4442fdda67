"""The direct cell channel's messages: signed, packed frames between the notebook and a rank.

A frame pair is ``[signature, payload]``: ``payload`` is the object packed by
the cluster's ipyparallel session (JSON by default), ``signature`` its HMAC
with that session's key, so only holders of the cluster's key can run code.
Pure functions: :mod:`mlx_jupyter.cluster.cells.hub` (notebook) and
:mod:`mlx_jupyter.cluster.rank.channel` (rank) do the I/O.

Messages (``t`` is the type):

- rank -> notebook ``hello {rank, pid}``: sent once on connecting;
- notebook -> rank ``cell {id, code}``: run ``code`` as a cell;
- rank -> notebook ``out {id, kind, content}``: an output of cell ``id``
  (``kind``: stream, display_data, execute_result, ...; content as on IOPub);
- rank -> notebook ``reply {id, content}``: the cell ended (content as an
  ``execute_reply``'s); always after its outputs.
"""

from __future__ import annotations

import hmac
from typing import Any, Sequence

#: the ``session`` of the requests the channel runs: their outputs are routed back through it
CHANNEL_SESSION = "mlx-jupyter-cell-channel"
#: env var telling a rank the port of the notebook's channel (absent or "0": no channel)
PORT_ENV = "MLX_JUPYTER_CELL_PORT"


class WireError(ValueError):
    """A frame pair that is malformed or not signed with the cluster's key."""


def encode(session: Any, obj: dict) -> list[bytes]:
    """``[signature, payload]`` for ``obj``."""
    payload = session.pack(obj)
    return [session.sign([payload]), payload]


def decode(session: Any, frames: Sequence[bytes]) -> dict:
    """The object in a frame pair from :func:`encode`; raises :class:`WireError` if unsigned or bad."""
    if len(frames) != 2:
        raise WireError(f"expected 2 frames (signature, payload), got {len(frames)}")
    signature, payload = bytes(frames[0]), bytes(frames[1])
    if not hmac.compare_digest(signature, session.sign([payload])):
        raise WireError("bad signature (not signed with this cluster's key)")
    try:
        obj = session.unpack(payload)
    except Exception as exc:
        raise WireError(f"payload does not unpack: {exc}") from None
    if not isinstance(obj, dict) or not isinstance(obj.get("t"), str):
        raise WireError("payload is not a message (a dict with a type 't')")
    return obj
