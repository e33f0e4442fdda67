"""Every use of ipyparallel's private API, in one place, checked before a cluster starts.

ipyparallel 9 (pinned in pyproject.toml) is what these were written against and tested
with; :func:`check_ipyparallel` names what a different version lacks and how to fix it.
"""

from __future__ import annotations

import contextlib
import inspect
import threading
import time
from functools import partial
from typing import AbstractSet, Any, Callable, Iterable, Iterator, Sequence

import ipyparallel as ipp
from ipyparallel.cluster.launcher import EngineLauncher

from mlx_jupyter.cluster.shared.errors import ClusterError

#: how to get an ipyparallel whose internals this package uses (named in every compat error)
IPP_FIX = "install ipyparallel 9.x: pip install 'ipyparallel>=9,<10'"

#: ipyparallel 9's private names we rely on, by class: the client's sends and streams
#: (aborts and status go to a rank's control channel by hand), the launcher's hooks
_IPP_CLASS_NEEDS = {
    "Client": (ipp.Client, ("_build_targets", "_send", "send_execute_request", "_closed", "outstanding")),
    "EngineLauncher": (EngineLauncher, ("notify_start", "notify_stop", "get_env", "loop", "engine_cmd",
                                        "engine_args", "environment", "state")),
}
_IPP_CLIENT_ATTRS = ("_control_stream", "_mux_stream", "_query_stream", "_io_loop", "session")

#: the client's ZMQ streams that zmqwatch keeps flushed
CLIENT_STREAMS = ("_mux_stream", "_control_stream", "_iopub_stream", "_notification_stream", "_query_stream")


def ipyparallel_problems(client: Any = None) -> list[str]:
    """The ipyparallel internals this package needs that are missing here (``[]``: none).

    With ``client``, its instance attributes (streams, I/O loop) are checked too.
    """
    missing = [f"{where}.{name}" for where, (cls, names) in _IPP_CLASS_NEEDS.items()
               for name in names if not hasattr(cls, name)]
    send = getattr(ipp.Client, "send_execute_request", None)
    if send is not None and "message_future_hook" not in inspect.signature(send).parameters:
        missing.append("Client.send_execute_request(message_future_hook=)")
    try:
        from ipyparallel.controller.hub import Hub

        if not hasattr(Hub, "unregister_engine"):  # the handler of our unregistration_request
            missing.append("Hub.unregister_engine")
    except ImportError:
        missing.append("ipyparallel.controller.hub.Hub")
    if client is not None:
        missing += [f"Client().{name}" for name in _IPP_CLIENT_ATTRS if not hasattr(client, name)]
    return missing


#: what our controller and engine subclasses override or call (cluster/ipcontroller.py,
#: cluster/rank/engine.py); checked by each of those processes as it starts
_SUBCLASS_NEEDS = {
    "controller": ("ipyparallel.controller.app", "IPController", ("init_hub", "save_connection_dict")),
    "engine": ("ipyparallel.engine.app", "IPEngine", ("init_engine", "register", "complete_registration",
                                                      "find_connection_file", "init_signal", "restore_output",
                                                      "start_heartbeat", "bident", "session")),
    # what cluster/ipcontroller.py's filter of the hub's monitor traffic uses
    "hub": ("ipyparallel.controller.hub", "Hub", ("dispatch_monitor_traffic", "expect_stopped_hearts",
                                                  "session")),
    # cluster/heartbeat.py's monitor, in the controller's heart monitor process
    "heartmonitor": ("ipyparallel.controller.heartmonitor", "HeartMonitor",
                     ("start", "beat", "handle_pong", "handle_new_hearts", "handle_heart_failure", "hearts",
                      "responses", "lifetime", "last_ping", "tic", "period", "max_heartmonitor_misses")),
}


def subclass_problems(which: str) -> list[str]:
    """What ``which`` ("controller" or "engine") needs of the ipyparallel class it extends and lacks."""
    module_name, cls_name, names = _SUBCLASS_NEEDS[which]
    try:
        module = __import__(module_name, fromlist=[cls_name])
    except ImportError:
        return [module_name]
    cls = getattr(module, cls_name, None)
    if cls is None:
        return [f"{module_name}.{cls_name}"]
    missing = [f"{cls_name}.{name}" for name in names if not hasattr(cls, name)]
    if which == "controller":
        if getattr(module, "time", None) is not time:  # init_hub's pause is skipped there
            missing.append(f"{module_name}.time")
        if not callable(getattr(module, "start_heartmonitor", None)):  # init_hub's heart monitor target
            missing.append(f"{module_name}.start_heartmonitor")
        missing += subclass_problems("heartmonitor") + subclass_problems("hub")
    return missing


def exit_unless_usable(which: str) -> None:
    """In our controller or engine process: exit 1 naming what is missing and the fix, before starting."""
    missing = subclass_problems(which)
    if missing:
        import sys

        print(f"mlx_jupyter {which}: ipyparallel {getattr(ipp, '__version__', '?')} lacks what it uses: "
              f"{', '.join(missing)}; {IPP_FIX}", file=sys.stderr)
        sys.exit(1)


@contextlib.contextmanager
def init_hub_without_pause() -> Iterator[None]:
    """While ``IPController.init_hub`` runs: its fixed 0.25 s ``time.sleep`` returns at once
    (ipyparallel 9 pauses there before writing the connection files everyone waits for)."""
    from ipyparallel.controller import app

    real = app.time
    app.time = _NoPause()
    try:
        yield
    finally:
        app.time = real


@contextlib.contextmanager
def heart_monitor_target(target: Callable[..., None]) -> Iterator[None]:
    """While ``IPController.init_hub`` runs: the heart monitor process it makes runs ``target``
    (called with ``start_heartmonitor``'s keyword arguments) instead of ipyparallel's own."""
    from ipyparallel.controller import app

    real = app.start_heartmonitor
    app.start_heartmonitor = target
    try:
        yield
    finally:
        app.start_heartmonitor = real


class _NoPause:
    """``time`` as ``init_hub`` sees it: the same, except that ``sleep`` returns at once."""

    def __getattr__(self, name: str) -> Any:
        return getattr(time, name)

    @staticmethod
    def sleep(_seconds: float) -> None:
        return None


def check_ipyparallel(client: Any = None) -> None:
    """Raise :class:`ClusterError` naming what is missing if this ipyparallel cannot be used."""
    missing = ipyparallel_problems(client)
    if missing:
        raise ClusterError(
            f"ipyparallel {getattr(ipp, '__version__', '?')} lacks what mlx_jupyter uses: "
            f"{', '.join(missing)}; {IPP_FIX}"
        )


def client_streams(client: Any) -> list[Any]:
    """The client's ZMQ streams (None for one it lacks)."""
    return [getattr(client, name, None) for name in CLIENT_STREAMS]


def is_closed(client: Any) -> bool:
    return client is None or client._closed


def send_control(client: Any, rank: int, msg_type: str, content: dict[str, Any]) -> Any:
    """Send ``msg_type`` to ``rank``'s control channel; a future of the reply."""
    ident = client._build_targets([rank])[0][0]
    return client._send(client._control_stream, msg_type, content=content, ident=ident)


def send_execute(client: Any, rank: int, code: str, hook: Callable[[Any], None], cell_number: int = 0,
                 first_line: int = 1) -> str:
    """Send ``code`` as an ``execute_request`` to ``rank``; ``hook(future)`` runs before any reply
    can arrive; ``cell_number``: the notebook's execution count, for the rank's tracebacks (0: none);
    ``first_line``: the number of the code's first line there. Returns the request's msg_id."""
    idents, _ = client._build_targets([rank])
    metadata: dict[str, Any] = {"label": "mlx_distributed", **({"cell_number": cell_number} if cell_number else {}),
                                **({"first_line": first_line} if first_line > 1 else {})}
    # through the client's ZMQStream, as ipyparallel's views do, never raw on
    # `_mux_socket`: a raw send on that DEALER (requests out, replies in) can
    # consume the edge-triggered ZMQ_FD's read edge without the stream seeing
    # it, leaving replies unread in the socket for good: the cell never ends
    fut = client.send_execute_request(
        client._mux_stream, code, silent=False, ident=idents[0],
        metadata=metadata, message_future_hook=hook,
    )
    msg_id: str = fut.msg_id
    return msg_id


def unregister(client: Any, ranks: Iterable[int]) -> None:
    """Tell the hub these engines are gone, so that their ids are free at once."""
    if is_closed(client):
        return
    for rank in ranks:
        client._io_loop.add_callback(
            partial(client.session.send, client._query_stream, "unregistration_request", content={"id": rank})
        )


def requests_outstanding(client: Any, ranks: Sequence[int], ignore: AbstractSet[str] = frozenset()) -> bool:
    """Whether a request sent through the controller is unanswered on one of ``ranks``,
    not counting the msg_ids in ``ignore`` (unknowable: True)."""
    outstanding = getattr(client, "_outstanding_dict", None)
    engines = getattr(client, "_engines", None)
    if outstanding is None or engines is None:
        return True
    return any(set(outstanding.get(engines.get(r)) or ()) - ignore for r in ranks)


def preload_serializer() -> None:
    """Import, in a background thread, what ipyparallel's serializer imports at a client's first
    apply (numpy; its cost: benchmarks/ready_trace.py): started with the controller, it is done
    while we wait for it."""
    def load() -> None:
        try:
            import numpy  # noqa: F401
        except Exception:  # no numpy: ipyparallel does without
            pass

    threading.Thread(target=load, name="mlx-preload", daemon=True).start()
