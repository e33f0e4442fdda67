"""What the installed MLX build can do, next to what the machine has (driver, libraries, devices).

`mlx_build(name)` asks `mlx.core.distributed.is_available(name)`: True/False, or None
("unknown") when MLX is missing or too old to answer per backend.
"""

from __future__ import annotations

import inspect
from typing import Any

from mlx_jupyter.vocab.backends import RECORDS

# Where the MLX build, not the machine, is what is missing: how to get an MLX that has it (each record's install).
MLX_FIX = {b.name: b.install for b in RECORDS}
_LABEL = {True: "yes", False: "no", None: "unknown"}


def _mlx_core() -> Any:
    """mlx.core, or None when MLX is not installed."""
    try:
        import mlx.core as mx
    except ImportError:
        return None
    return mx


def _query() -> Any:
    """MLX's `distributed.is_available` if it takes a backend name, else None."""
    mx = _mlx_core()
    fn = getattr(getattr(mx, "distributed", None), "is_available", None)
    if fn is None:
        return None
    try:
        sig = inspect.signature(fn)
        if "backend" not in sig.parameters and len(sig.parameters) == 0:
            return None
    except (TypeError, ValueError):  # nanobind functions may not expose a signature
        doc = getattr(fn, "__doc__", "") or ""
        if "backend" not in doc:
            return None
    return fn


def mlx_build(name: str) -> bool | None:
    """Whether this MLX build can instantiate backend `name`; None when it cannot say."""
    fn = _query()
    if fn is None:
        return None
    try:
        return bool(fn(name))
    except TypeError:  # an MLX whose is_available() takes no backend
        return None
    except (ValueError, RuntimeError):  # a name this MLX does not know
        return False


def label(value: bool | None) -> str:
    """'yes', 'no' or 'unknown' for the mlx-build column."""
    return _LABEL[value]


def combine(row: dict[str, Any]) -> dict[str, Any]:
    """A machine-probe row with the MLX-build column added; available only when both allow it.

    An MLX that cannot answer ("unknown") leaves the machine's answer standing.
    """
    out = dict(row)
    machine = bool(row["available"])
    build = mlx_build(row["name"])
    out["machine"] = machine
    out["mlx"] = build
    out["available"] = machine and build is not False
    if machine and build is False:
        out["detail"] = f"{row['detail']}, but this MLX build has no {row['name']}"
        out["fix"] = MLX_FIX.get(row["name"], "install an MLX build with this backend")
    return out
