"""Which global names a rank's cells computed from what is its own: its rank number or its process.

Read from the cells' source (``In``), when a dead rank's names are to come from a single live peer and
nothing can be compared: such names must not be copied (a copy would hold the peer's rank data, its
``os.getpid()``). A collective that leaves the same value on every rank (``all_sum``, ``all_gather``...)
ends the dependence: ``losses.append(all_sum(loss).item())`` holds the same list everywhere.
"""

from __future__ import annotations

import ast
from typing import Optional

#: strings that name a rank's number in its environment
_RANK_VARS = frozenset({"MLX_RANK", "RANK", "LOCAL_RANK", "OMPI_COMM_WORLD_RANK", "PMI_RANK", "SLURM_PROCID"})
#: calls whose value is this rank's own: its number, its process, its machine
_OWN_CALLS = frozenset({"rank", "getpid", "getppid", "gethostname", "get_ident", "get_native_id", "uuid1",
                        "uuid4", "node"})
#: collectives whose result is the same on every rank of the group (not sum_scatter, send or recv)
_SAME_EVERYWHERE = frozenset({"all_sum", "all_max", "all_min", "all_gather"})
#: the methods that put a value into a list, set or deque
_FILLS = frozenset({"append", "extend", "insert", "add", "appendleft", "extendleft"})


def rank_dependent(sources: list[str]) -> list[str]:
    """The global names cells assigned from the rank's number (``world.rank()``, ``MLX_RANK``) or its
    process (``os.getpid()``), or from a name so assigned (``Xs = X[r::n]``, then ``loss = f(Xs)``)."""
    tainted: set[str] = set()
    for src in sources:
        try:
            tree = ast.parse(src)
        except (SyntaxError, ValueError):
            continue
        for stmt in _module_level(tree.body):
            if isinstance(stmt, (ast.Assign, ast.AugAssign, ast.AnnAssign)) and stmt.value is not None:
                if _depends(stmt.value, tainted):
                    for target in (stmt.targets if isinstance(stmt, ast.Assign) else [stmt.target]):
                        tainted |= _bound(target)
            elif isinstance(stmt, ast.Expr) and isinstance(stmt.value, ast.Call):
                call = stmt.value   # losses.append(f(r)): the list now holds the rank's data (opt.update(g) does
                # not make the optimizer the rank's: its gradients were averaged, which no parse can tell)
                if isinstance(call.func, ast.Attribute) and call.func.attr in _FILLS \
                        and _depends(call, tainted, skip=call.func):
                    tainted |= _bound(call.func.value)
    return sorted(tainted)


def _module_level(body: list[ast.stmt]) -> list[ast.stmt]:
    """A cell's statements that bind globals: its own and those in its loops, ifs, withs and trys."""
    out: list[ast.stmt] = []
    for stmt in body:
        out.append(stmt)
        if isinstance(stmt, (ast.For, ast.AsyncFor, ast.While, ast.If, ast.With, ast.AsyncWith, ast.Try)):
            for block in ("body", "orelse", "finalbody"):
                out.extend(_module_level(getattr(stmt, block, []) or []))
            for handler in getattr(stmt, "handlers", []) or []:
                out.extend(_module_level(handler.body))
    return out


def _called(node: ast.Call) -> str:
    """The name a call calls: ``f`` of ``f(x)`` and of ``a.b.f(x)``."""
    func = node.func
    return func.attr if isinstance(func, ast.Attribute) else func.id if isinstance(func, ast.Name) else ""


def _depends(expr: ast.AST, tainted: set[str], skip: Optional[ast.AST] = None) -> bool:
    """Whether ``expr`` reads the rank's own (outside the subtrees of collectives that agree everywhere)."""
    if expr is skip:
        return False
    if isinstance(expr, ast.Call):
        name = _called(expr)
        if name in _SAME_EVERYWHERE:
            return False
        if name in _OWN_CALLS:
            return True
    if isinstance(expr, ast.Name) and expr.id in tainted:
        return True
    if isinstance(expr, ast.Constant) and expr.value in _RANK_VARS:
        return True
    return any(_depends(child, tainted, skip) for child in ast.iter_child_nodes(expr))


def _bound(target: ast.AST) -> set[str]:
    """The global names an assignment target binds or changes (``a, b``, ``d[k]``, ``obj.x``)."""
    if isinstance(target, ast.Name):
        return {target.id}
    if isinstance(target, (ast.Tuple, ast.List)):
        return set().union(*(_bound(t) for t in target.elts)) if target.elts else set()
    if isinstance(target, ast.Starred):
        return _bound(target.value)
    if isinstance(target, (ast.Subscript, ast.Attribute)):
        return _bound(target.value)
    return set()
