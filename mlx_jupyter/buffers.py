"""Zero-copy user buffers: memory from a pointer, a shape and a dtype, freed by a deleter.

`Buffer.wrap(obj)` views any buffer-protocol or DLPack object without copying
and keeps it alive; `Buffer.from_pointer(address, shape, dtype, deleter)` uses
raw memory in place and calls `deleter(address)` exactly once when the last
view dies (at once, if the memory was misaligned and had to be copied, or
before `from_pointer` raises for a bad address, shape or dtype). A
Buffer exports the buffer protocol and `__dlpack__`, so numpy, MLX and torch
can view it, and it can be passed as `out=` to every collective.
"""

from mlx_jupyter import _core
from mlx_jupyter.collective.mlx_arrays import buffer_to_mlx

Buffer = _core.Buffer

Buffer.to_mlx = buffer_to_mlx  # type: ignore[attr-defined]  # a real mlx.core.array (see mlx_arrays)


def _buffer_repr(buf: Buffer) -> str:
    """``Buffer(shape=(2, 3), dtype=float32)``: the shape written as Python writes a tuple."""
    return f"Buffer(shape={tuple(buf.shape)!r}, dtype={buf.dtype})"


Buffer.__repr__ = _buffer_repr  # type: ignore[method-assign]  # the core's reads (2,3,)

__all__ = ["Buffer"]
