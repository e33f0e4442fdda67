"""The shapes of what the MLX call record keeps and sends (:mod:`.mlx_calls`), for type checking.

Imported only under ``TYPE_CHECKING``: a rank's start loads nothing of it.
"""

from __future__ import annotations

from types import CodeType
from typing import Any, Callable, Optional, TypeAlias, TypedDict

#: one call in the record: ``(key, seq, op, x, peer, code, lasti, via, out)`` (:class:`.mlx_calls.Record` says)
Made: TypeAlias = tuple[str, int, str, Any, Optional[int], Optional[CodeType], int, Optional[str], Any]
#: MLX's functions and our wrappers of them (MLX's values have no Python types)
Fn: TypeAlias = Callable[..., Any]


class SentCall(TypedDict):
    """One recorded call as a sample sends it (:meth:`.mlx_calls.Record.snapshot`)."""

    key: str
    seq: int
    op: str
    dtype: str
    shape: Optional[list[int]]
    peer: Optional[int]
    at: str
    via: Optional[str]


class SentRecord(TypedDict):
    """The record as a sample sends it: the calls per key, the groups' (rank, size), the newest calls."""

    counts: dict[str, int]
    groups: dict[str, list[int]]
    calls: list[SentCall]
#: one MLX call a profile timed (:mod:`.mlx_profile`): ``(key, seq, op, nbytes, dtype, shape, code, lasti, via,
#: start_ns, end_ns or None, ok, peer)``
Timed: TypeAlias = tuple[str, int, str, int, str, tuple[int, ...], Optional[CodeType], int, Optional[str], int,
                         Optional[int], bool, Optional[int]]
