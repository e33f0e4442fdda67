"""The names the product defines in a rank's namespace (``mx``, ``world``, ``group``), kept apart
from the user's.

The product keeps its own handles here, as module state of the rank, and binds a name in the
user's namespace only where it is absent or still holds the very object the product put there:
a ``group`` the user bound (``group = mx.distributed.init(...)``) is never replaced. Also here:
whether MLX's world is dead on this rank, and the check that refuses a cell using it.
"""

from __future__ import annotations

import ast
from typing import Any, MutableMapping, Optional

from IPython.core.error import InputRejected

from mlx_jupyter.cluster.shared import world_words

#: the names the product may define, in the order a setup binds them
PRODUCT_NAMES = ("mx", "world", "group")


class ProductNames:
    """The objects the product made for this rank, and the rule for binding them to user names."""

    def __init__(self) -> None:
        self.placed: dict[str, Any] = {}  # name -> the object the product last bound to it
        self.group: Any = None  # our core's group, formed by the product (bound as `group` or not)
        self.world: Any = None  # MLX's world group the product formed
        #: why MLX's world is unusable on this rank ("" while it is usable), and how to get a new one
        self.world_dead = ""
        self.restart_advice = ""

    def owns(self, ns: MutableMapping[str, Any], name: str) -> bool:
        """Whether ``name`` in ``ns`` still holds the object the product put there."""
        return name in ns and name in self.placed and ns[name] is self.placed[name]

    def may_bind(self, ns: MutableMapping[str, Any], name: str) -> bool:
        """The product may (re)bind ``name``: it is absent, or still the product's."""
        return name not in ns or self.owns(ns, name)

    def bind(self, ns: MutableMapping[str, Any], name: str, value: Any) -> bool:
        """Bind ``name`` to ``value`` if the product may (see :meth:`may_bind`); whether it did."""
        if not self.may_bind(ns, name):
            return False
        ns[name] = value
        self.placed[name] = value
        return True

    def group_aborted(self) -> bool:
        """Whether the product's core group exists and was aborted (a peer's failure, an interrupted op)."""
        group = self.group
        try:
            return group is not None and bool(group.aborted)
        except Exception:
            return False

    def world_is_dead(self, reason: str, restart_advice: str = "") -> None:
        """MLX's world cannot be used again on this rank (its sockets were shut down, here or on a peer)."""
        self.world_dead = reason or "its sockets were shut down"
        if restart_advice:
            self.restart_advice = restart_advice


#: this rank's product names (one per engine process)
NAMES = ProductNames()


class WorldClosedError(InputRejected):
    """A cell that uses MLX's dead world was refused before it ran: one line says why and what to do."""

    def _render_traceback_(self) -> list[str]:
        return [f"WorldClosedError: {self}"]


def uses_mlx_world(tree: ast.AST, ns: MutableMapping[str, Any]) -> bool:
    """Whether code uses MLX's distributed layer: ``world``, any ``.distributed`` attribute
    (``mx.distributed.all_sum``), or a name bound to an MLX group or an ``mlx.core.distributed`` function."""
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and node.attr == "distributed":
            return True
        if isinstance(node, ast.Name):
            if node.id == "world":
                return True
            value = ns.get(node.id)
            if value is not None and _is_mlx_distributed(value):
                return True
    return False


def _is_mlx_distributed(value: Any) -> bool:
    kind = type(value)
    module = getattr(kind, "__module__", "") or ""
    if module.startswith("mlx.core") and kind.__name__ == "Group":
        return True
    return callable(value) and (getattr(value, "__module__", "") or "").startswith("mlx.core.distributed")


class WorldGuard(ast.NodeTransformer):
    """Installed on every rank: once MLX's world is dead there, a cell that uses it is refused
    before its first line with one clear line, instead of MLX's socket errors."""

    def __init__(self, ns: MutableMapping[str, Any], names: Optional[ProductNames] = None) -> None:
        self.ns, self.names = ns, names or NAMES

    def visit(self, node: ast.AST) -> ast.AST:
        names = self.names
        if names.world_dead and uses_mlx_world(node, self.ns):
            advice = f"; {names.restart_advice}" if names.restart_advice else "; restart the ranks for a new one"
            raise WorldClosedError(f"{world_words.shut_down(names.world_dead)}, so this cell, which uses it, "
                                   f"did not run{advice}")
        return node
