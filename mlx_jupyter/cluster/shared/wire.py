"""The direct cell channel's messages: signed, packed frames between the notebook and a rank.

A frame pair is ``[signature, payload]``: ``payload`` is the object packed by
the cluster's ipyparallel session (JSON by default), ``signature`` its HMAC
with that session's key, so only holders of the cluster's key can run code.
On the TCP stream each pair is preceded by their two lengths (:func:`frame`,
:class:`FrameReader`). Pure functions: :mod:`mlx_jupyter.cluster.cells.cell_server`
(notebook) and :mod:`mlx_jupyter.cluster.rank.channel` (rank) do the I/O.

Messages (``t`` is the type):

- rank -> notebook ``hello {rank, pid}``: sent once on connecting;
- notebook -> rank ``cell {id, code}``: run ``code`` as a cell;
- rank -> notebook ``out {id, kind, content}``: an output of cell ``id``
  (``kind``: stream, display_data, execute_result, ...; content as on IOPub);
- rank -> notebook ``where {id, s}``: a sample of where the rank is in cell ``id``
  (:mod:`mlx_jupyter.where.sample`), a few times a second while it runs;
- rank -> notebook ``dbg {id, text, prompt, done}``: a pdb session on the rank during cell
  ``id`` wrote ``text``; with a ``prompt`` (e.g. ``(Pdb rank 1) ``) it waits for a line;
  ``done``: the session ended (continue without breakpoints, or quit);
- notebook -> rank ``dbg_in {line}``: the answer to that prompt (``None``: the notebook
  cannot prompt, e.g. nbclient without stdin);
- notebook -> rank ``call {id, fn, args}``: run the product's function ``fn`` (``module:function``,
  one :mod:`mlx_jupyter.cluster.rank.calls` allows), answered by a ``reply`` whose content holds
  ``value`` (a restart's save and restore when the controller is dead);
- rank -> notebook ``reply {id, content}``: the cell ended (content as an
  ``execute_reply``'s); always after its outputs.
"""

from __future__ import annotations

import hmac
import struct
from typing import Any, Sequence

#: the ``session`` of the requests the channel runs: their outputs are routed back through it
CHANNEL_SESSION = "mlx-jupyter-cell-channel"


#: the lengths before each frame pair on the stream: signature, payload (big-endian)
HEADER = struct.Struct("!II")
#: the longest signature accepted (an HMAC's hex digest: 128 characters for SHA-512)
MAX_SIGNATURE = 256
#: the largest payload accepted (a cell's code, or one output such as an image)
MAX_PAYLOAD = 1 << 30


class WireError(ValueError):
    """A frame pair that is malformed or not signed with the cluster's key."""


def frame(frames: Sequence[bytes]) -> bytes:
    """The bytes that carry a frame pair on the stream."""
    signature, payload = frames
    return HEADER.pack(len(signature), len(payload)) + bytes(signature) + bytes(payload)


class FrameReader:
    """Turns the bytes of a stream, in chunks of any size, back into frame pairs."""

    def __init__(self, max_payload: int = MAX_PAYLOAD):
        self.max_payload = max_payload
        self._buf = bytearray()

    def feed(self, data: bytes) -> list[list[bytes]]:
        """The frame pairs completed by ``data``; raises :class:`WireError` on lengths no pair has."""
        self._buf += data
        pairs = []
        while len(self._buf) >= HEADER.size:
            sig_len, payload_len = HEADER.unpack_from(self._buf)
            if sig_len > MAX_SIGNATURE or payload_len > self.max_payload:
                raise WireError(f"frame lengths {sig_len}, {payload_len} exceed the limits "
                                f"({MAX_SIGNATURE}, {self.max_payload})")
            end = HEADER.size + sig_len + payload_len
            if len(self._buf) < end:
                break
            pairs.append([bytes(self._buf[HEADER.size:HEADER.size + sig_len]),
                          bytes(self._buf[HEADER.size + sig_len:end])])
            del self._buf[:end]
        return pairs

    @property
    def buffered(self) -> int:
        """Bytes of an incomplete pair held."""
        return len(self._buf)


def encode(session: Any, obj: dict[str, Any]) -> list[bytes]:
    """``[signature, payload]`` for ``obj``."""
    payload = session.pack(obj)
    return [session.sign([payload]), payload]


def decode(session: Any, frames: Sequence[bytes]) -> dict[str, Any]:
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
