"""A bare ``%%mlx_distributed`` cell starts on the ranks as soon as the notebook's kernel takes it.

Between ipykernel taking an ``execute_request`` and IPython calling the cell magic, the kernel
spends about a millisecond (the input's echo, IPython's transforms, history, compile) while the
ranks wait, and a core of the machine idles. A cell whose magic line is empty, for a running
cluster this kernel owns that needs no setup first, is started in that moment instead: the
kernel's ``execute_request`` handler is wrapped, the run is kept under the request's id, and the
magic, called by IPython with that same cell, shows that run (:func:`claim`) rather than starting
one. Everything else (options on the line, a connected notebook, ranks to set up or mend, an
error to report) takes the magic's usual way, which says what is wrong.

A run no magic claimed (IPython never got to it: an interrupt in between) is shown after the
cell by a ``post_run_cell`` hook, so no cell runs unseen.
"""

from __future__ import annotations

import ast
import inspect
import logging
from dataclasses import dataclass
from typing import Any, Callable, Optional

log = logging.getLogger("mlx_jupyter.early_cells")

#: the magic whose bare cells start early, as a cell's first line
MAGIC = "%%mlx_distributed"


@dataclass
class Early:
    """A cell started before its magic was called: what the magic must be called with, and the run."""

    line: str
    body: str
    run: Any


#: request id -> its early run, until the magic claims it (or the cell ends)
_EARLY: dict[str, Early] = {}


def install(ip: Any, cluster: Callable[[], Any]) -> bool:
    """Wrap ``ip``'s kernel's ``execute_request`` (ipykernel only; elsewhere nothing happens);
    ``cluster()`` is the magics' current cluster. Whether it is installed."""
    kernel = getattr(ip, "kernel", None)
    handlers = getattr(kernel, "shell_handlers", None)
    if not isinstance(handlers, dict) or "execute_request" not in handlers or not hasattr(kernel, "get_parent"):
        return False
    original = handlers["execute_request"]
    if getattr(original, "_mlxj_early", False):
        return True

    async def execute_request(stream: Any, ident: Any, parent: dict[str, Any]) -> Any:
        try:
            start(ip, cluster(), parent)
        except Exception:  # never in the way of the cell: the magic then takes its usual way
            log.debug("early start failed", exc_info=True)
        result = original(stream, ident, parent)
        return await result if inspect.isawaitable(result) else result

    execute_request._mlxj_early = True  # type: ignore[attr-defined]
    execute_request._mlxj_original = original  # type: ignore[attr-defined]
    handlers["execute_request"] = execute_request
    ip.events.register("post_run_cell", _unclaimed)
    return True


def uninstall(ip: Any) -> None:
    """Undo :func:`install`."""
    handlers = getattr(getattr(ip, "kernel", None), "shell_handlers", None)
    if isinstance(handlers, dict) and getattr(handlers.get("execute_request"), "_mlxj_early", False):
        handlers["execute_request"] = handlers["execute_request"]._mlxj_original
    try:
        ip.events.unregister("post_run_cell", _unclaimed)
    except ValueError:
        pass


def magic_call(ip: Any, code: str) -> Optional[tuple[str, str]]:
    """The (line, cell) IPython will call ``%%mlx_distributed`` with for ``code``, if ``code`` is that
    magic's cell and nothing may change the call on the way (no AST transformer); else None."""
    if getattr(ip, "ast_transformers", None):
        return None
    try:
        tree = ast.parse(ip.transform_cell(code))
    except Exception:
        return None
    if len(tree.body) != 1 or not isinstance(tree.body[0], ast.Expr):
        return None
    call = tree.body[0].value
    if not (isinstance(call, ast.Call) and isinstance(call.func, ast.Attribute)
            and call.func.attr == "run_cell_magic" and not call.keywords and len(call.args) == 3
            and all(isinstance(a, ast.Constant) and isinstance(a.value, str) for a in call.args)):
        return None
    name, line, body = (a.value for a in call.args)  # type: ignore[attr-defined]
    # IPython refuses a cell magic whose body is empty, before calling it
    return (line, body) if name == MAGIC[2:] and body.strip() else None


def start(ip: Any, cluster: Any, parent: dict[str, Any]) -> Optional[Early]:
    """Start ``parent``'s cell on the ranks now if it is a bare ``%%mlx_distributed`` cell that
    needs nothing first (see the module docstring); the early run, or None."""
    content = parent.get("content") or {}
    code = content.get("code")
    if not isinstance(code, str) or not code.startswith(MAGIC) or content.get("silent"):
        return None
    first, _, rest = code.partition("\n")
    if first.strip() != MAGIC or not rest.strip() or cluster is None or not _ready(cluster):
        return None
    call = magic_call(ip, code)
    msg_id = str((parent.get("header") or {}).get("msg_id") or "")
    if call is None or call[0].strip() or not msg_id:
        return None
    from mlx_jupyter.cluster import ClusterError

    try:
        run = cluster.run(call[1])
    except ClusterError:
        return None   # a dead or busy rank: the magic says so
    early = _EARLY[msg_id] = Early(call[0], call[1], run)
    return early


def _ready(cluster: Any) -> bool:
    """A cluster this kernel owns, running, whose names need no setup or mending before a cell."""
    from mlx_jupyter.cluster import Cluster

    return (isinstance(cluster, Cluster) and cluster.running and cluster.namespaces.ready
            and not cluster.table.unsettled)


def _request_id(ip: Any) -> str:
    try:
        return str(ip.kernel.get_parent("shell")["header"]["msg_id"])
    except Exception:
        return ""


def claim(ip: Any, line: str, cell: str) -> Optional[Any]:
    """The run started early for the cell being run, if the magic is called with what it ran
    (``line``, ``cell``); None: the magic runs the cell its usual way. An early run of other code
    (something changed the magic's call) is shown first, then the magic runs what it was given."""
    early = _EARLY.pop(_request_id(ip), None)
    if early is None:
        return None
    if early.line == line and early.body == cell:
        return early.run
    _show(early.run)
    return None


def _unclaimed(result: Any = None) -> None:
    """After a cell (``post_run_cell``): show a run started early that no magic claimed (stopped
    first if the cell was interrupted)."""
    err = getattr(result, "error_before_exec", None) or getattr(result, "error_in_exec", None)
    for msg_id in list(_EARLY):
        run = _EARLY.pop(msg_id).run
        if isinstance(err, KeyboardInterrupt):
            run.interrupt("interrupted by the user")
        _show(run)


def _show(run: Any) -> None:
    """Show ``run`` until it ends (its error printed, not raised: a hook must not raise)."""
    from mlx_jupyter.cluster.cells.display import DistributedCellError, show_run

    try:
        show_run(run)
    except DistributedCellError as err:
        print("\n".join([f"DistributedCellError: {err}", *err.lines]))
    except KeyboardInterrupt:
        pass
