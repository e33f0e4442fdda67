"""The product's own calls on a rank over the cell channel (``call {id, fn, args}``): a restart's
save and restore, and the per-cell state record's switch, without the controller (it may be dead).

Only the functions listed in :data:`ALLOWED` run (the message is signed with the cluster's key
anyway); each runs on the engine's main loop under the kernel's lock, as an ``apply_request``
would, and its JSON-able answer comes back as the call's reply (``{"status": "ok", "value": ...}``).
"""

from __future__ import annotations

import importlib
from typing import Any, Callable

from mlx_jupyter.cluster.rank.kernel_compat import main_lock

#: module -> the functions of it a call may name
ALLOWED: dict[str, frozenset[str]] = {
    "mlx_jupyter.cluster.rank.keep": frozenset({"save", "restore", "import_modules", "discard"}),
    "mlx_jupyter.cluster.rank.peer_copy": frozenset({"save_digested", "restore_from", "serve", "fetch_from"}),
    "mlx_jupyter.cluster.rank.keep_files": frozenset({"remove_folders"}),
    "mlx_jupyter.cluster.rank.shard_reload": frozenset({"reload"}),
    "mlx_jupyter.cluster.rank.state_record": frozenset({"enable", "disable", "restore", "describe"}),
}


def name_of(fn: Callable[..., Any]) -> str:
    """``module:function`` for a function a call may name; ValueError for any other."""
    module, name = getattr(fn, "__module__", ""), getattr(fn, "__name__", "")
    if name not in ALLOWED.get(module, ()):
        raise ValueError(f"{module}.{name} is not a function the cell channel may call on a rank")
    return f"{module}:{name}"


def resolve(spec: str) -> Callable[..., Any]:
    """The function ``module:function`` names, if :data:`ALLOWED`; ValueError otherwise."""
    module, _, name = str(spec).partition(":")
    if name not in ALLOWED.get(module, ()):
        raise ValueError(f"{spec!r} is not a function the cell channel may call on a rank")
    fn: Callable[..., Any] = getattr(importlib.import_module(module), name)
    return fn


async def run(kernel: Any, post: Callable[[dict[str, Any]], None], msg: dict[str, Any]) -> None:
    """Run the call ``msg`` names (after any request running now), then post its reply."""
    from jupyter_client.jsonutil import json_clean

    msg_id = str(msg.get("id", ""))
    try:
        fn = resolve(str(msg.get("fn", "")))
        args = msg.get("args") or []
        async with main_lock(kernel):
            value = fn(*args)
        content: dict[str, Any] = {"status": "ok", "value": json_clean(value)}
    except BaseException as exc:  # noqa: BLE001 - the notebook gets the rank's error as one line
        text = (str(exc).strip().splitlines() or [""])[0][:300]
        content = {"status": "error", "ename": type(exc).__name__, "evalue": text, "traceback": []}
    post({"t": "reply", "id": msg_id, "content": content})
