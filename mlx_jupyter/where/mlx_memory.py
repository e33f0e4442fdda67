"""MLX's own memory figures of this process (active, peak, cache), for the where samples.

Read only when the process has already imported ``mlx.core``: a rank that never used MLX is not
made to load it. Each figure is one call into MLX's allocator (no evaluation, no lock of ours).
"""

from __future__ import annotations

import sys
from typing import Any, Callable, Optional

#: the figures, as the samples name them, and MLX's function for each (top level since MLX 0.25;
#: ``mx.metal`` before)
FIGURES = (("active", "get_active_memory"), ("peak", "get_peak_memory"), ("cache", "get_cache_memory"))


def _reader(mx: Any, name: str) -> Optional[Callable[[], int]]:
    fn = getattr(mx, name, None)
    if fn is None:
        fn = getattr(getattr(mx, "metal", None), name, None)
    return fn if callable(fn) else None


def read() -> Optional[dict[str, int]]:
    """``{"active": bytes, "peak": bytes, "cache": bytes}`` (those MLX has), or None when this process
    has not imported MLX or MLX gives none of them."""
    mx = sys.modules.get("mlx.core")
    if mx is None:
        return None
    out = {}
    for key, name in FIGURES:
        fn = _reader(mx, name)
        if fn is None:
            continue
        try:
            out[key] = int(fn())
        except Exception:  # a sampler never fails the rank
            continue
    return out or None
