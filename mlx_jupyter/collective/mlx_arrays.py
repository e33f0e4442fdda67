"""Real `mlx.core.array` objects over user memory, via MLX's C++ constructor.

`array_from_pointer(address, shape, dtype, deleter)` and `Buffer.to_mlx()` call
`mlx::core::array(data, shape, dtype, deleter)` in the native `_mlx_bridge` module:
no copy where MLX's allocator can adopt the memory (Metal), otherwise one copy
with the deleter called right after it. `deleter(address)` runs exactly once.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Sequence
from typing import Any

FIX = ("Fix: install MLX into the environment that builds mlx-jupyter "
       "(pip install 'mlx[cpu]>=0.29' on Linux, 'mlx>=0.29' on macOS), then reinstall mlx-jupyter "
       "(pip install --force-reinstall --no-deps mlx-jupyter, or pip install -e . in a checkout).")


def _bridge() -> Any:
    """The native bridge, or an ImportError that says why it is missing and how to fix it."""
    import mlx.core as mx  # loads libmlx.so first, so the bridge links to the very library MLX uses

    try:
        bridge = importlib.import_module("mlx_jupyter._mlx_bridge")
    except ImportError as e:
        raise ImportError(f"mlx_jupyter._mlx_bridge is not available ({e}): this mlx-jupyter was built "
                          f"without MLX's headers and CMake files. {FIX}") from e
    installed = str(getattr(mx, "__version__"))  # (not in MLX's stubs)
    if bridge.MLX_VERSION != installed:  # MLX's C++ ABI is not stable across releases
        raise ImportError(f"mlx_jupyter._mlx_bridge was built against MLX {bridge.MLX_VERSION}, but MLX "
                          f"{installed} is installed. {FIX}")
    return bridge


def array_from_pointer(address: int, shape: Sequence[int], dtype: str,
                       deleter: Callable[[int], Any] | None = None) -> Any:
    """An `mlx.core.array` over `address`; `deleter(address)` runs exactly once (also before any error)."""
    try:
        bridge = _bridge()
    except ImportError:
        if deleter is not None and callable(deleter):
            deleter(address)  # the memory was handed over: honour the exactly-once promise
        raise
    return bridge.array_from_pointer(address, shape, dtype, deleter)


def buffer_to_mlx(buf: Any) -> Any:
    """An `mlx.core.array` over `buf`'s memory; `buf` stays alive until MLX is done with it."""
    bridge = _bridge()
    # The closure holds the Buffer; the bridge releases it exactly once (after MLX's copy, or
    # when MLX frees the adopted memory).
    return bridge.array_from_pointer(buf.address, tuple(buf.shape), buf.dtype, lambda _addr, keep=buf: None)
