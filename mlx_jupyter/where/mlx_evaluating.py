"""Is a thread in MLX's evaluation? Told from its innermost frame, when a sample is taken.

MLX is lazy: a collective's call (:mod:`mlx_jupyter.where.mlx_calls`) only builds it, and the rank blocks
where an array is evaluated (``print(y)``, ``y.item()``, ``mx.eval(loss)``). :func:`evaluating` names that
call from the frame's source (Python 3.11's positions of the instruction, else its line).
"""

from __future__ import annotations

import ast
import linecache
from typing import Any, Optional

#: calls that evaluate an array whatever their argument is called
_EVALUATING = (".item(", ".tolist(", "mx.eval(", "mx.async_eval(", "np.array(", "np.asarray(", "mx.synchronize(")


def evaluating(frame: Any) -> Optional[str]:
    """The call the innermost ``frame`` is in, when it evaluates MLX arrays (``print(y)``, ``y.item()``,
    ``mx.eval(loss)``, a call inside MLX's Python code); None otherwise (``time.sleep(5)``)."""
    if frame is None:
        return None
    module = str(frame.f_globals.get("__name__", ""))
    if _mlx_module(module):
        return f"{module}.{frame.f_code.co_name}"
    text = _call_text(frame)
    if not text:
        return None
    if any(marker in text for marker in _EVALUATING):
        return text
    try:
        tree = ast.parse(text.strip(), mode="eval")
    except SyntaxError:
        return None
    names = {n.id for n in ast.walk(tree) if isinstance(n, ast.Name)}
    if not names:
        return None
    scopes = [frame.f_globals, frame.f_builtins]
    if frame.f_code.co_flags & 0x02:  # CO_NEWLOCALS: a function's frame, whose locals are its own
        try:
            scopes.insert(0, frame.f_locals)
        except Exception:
            pass
    for name in names:
        for scope in scopes:
            if name in scope:
                if _is_mlx(scope[name]):
                    return text
                break
    return None


def _is_mlx(value: Any) -> bool:
    if _mlx_module(getattr(type(value), "__module__", None)):
        return True   # an array, a Group, a model or optimizer of mlx.nn/mlx.optimizers
    if isinstance(value, (list, tuple, dict)):
        items = value.values() if isinstance(value, dict) else value
        return any(_mlx_module(getattr(type(v), "__module__", None)) for v in list(items)[:8])
    if isinstance(value, type):
        return False
    return _mlx_module(getattr(value, "__module__", None) or getattr(value, "__name__", None))


def _mlx_module(name: Any) -> bool:
    return isinstance(name, str) and (name == "mlx" or name.startswith("mlx."))


def _call_text(frame: Any) -> str:
    """The source of the expression ``frame`` is executing now (Python 3.11+), else its line."""
    code, lineno = frame.f_code, frame.f_lineno
    positions = getattr(code, "co_positions", None)
    if positions is not None and frame.f_lasti >= 0:
        try:
            for i, pos in enumerate(positions()):
                if i == frame.f_lasti // 2:
                    start, end, col, end_col = pos
                    if None in pos:
                        break
                    lines = [linecache.getline(code.co_filename, n, frame.f_globals) for n in range(start, end + 1)]
                    if start == end:
                        return lines[0].encode()[col:end_col].decode(errors="replace")
                    lines[0] = lines[0].encode()[col:].decode(errors="replace")
                    lines[-1] = lines[-1].encode()[:end_col].decode(errors="replace")
                    return "".join(lines)
        except Exception:
            pass
    return linecache.getline(code.co_filename, lineno, frame.f_globals).strip()
