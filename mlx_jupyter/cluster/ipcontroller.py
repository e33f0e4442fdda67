"""`python -m mlx_jupyter.cluster.ipcontroller`: ipyparallel's controller, minus a fixed start-up pause
and with a heart monitor that beats quickly only while ranks are being admitted (``cluster/heartbeat.py``).

ipyparallel 9's ``IPController.init_hub`` sleeps 0.25 s after opening its task
database (a wait for a database server; ``--nodb`` has none) before it writes
the connection files that the client and the engines wait for. This controller
skips that sleep and writes the files atomically, so that they can be polled
for often without ever being read half-written, and it does not import numpy. It also stops when the process
that started it (the kernel) is gone, killed or not: ipyparallel's controller
outlived a SIGKILLed kernel. Everything else is ipyparallel's.
"""

from __future__ import annotations

import json
import os
import signal
import stat
import sys
import tempfile
import threading
import time
from typing import Any, Container, Protocol, Sequence

if __name__ == "__main__":
    # ipyparallel's task scheduler imports numpy only for its "weighted" scheme, which this
    # controller never uses; that import is half of this process's start, and the ranks wait
    # for this process's connection files (the cluster's ready time). Only in our own process.
    sys.modules.setdefault("numpy", None)  # type: ignore[arg-type]

from ipyparallel.controller.app import IPController

from mlx_jupyter.cluster import heartbeat
from mlx_jupyter.cluster.shared.ipp_compat import exit_unless_usable, heart_monitor_target, init_hub_without_pause


class MonitorHub(Protocol):
    """What the monitor's filter reads of ipyparallel's ``Hub``: its session (to read a message) and the
    hearts of the engines unregistered on purpose (see ``shared/ipp_compat.py``)."""

    @property
    def session(self) -> Any: ...   # jupyter_client's Session, reached through ipyparallel (untyped)
    @property
    def expect_stopped_hearts(self) -> Container[bytes]: ...


class MLXController(IPController):  # type: ignore[misc]  # ipyparallel ships no types: its base is Any
    """IPController without the pause in ``init_hub``; connection files written atomically; our heart monitor."""

    def init_hub(self) -> None:
        with init_hub_without_pause(), heart_monitor_target(heartbeat.start_heartmonitor):
            super().init_hub()
        hub = getattr(self, "hub", None)   # None: ipyparallel made no hub (nothing to filter)
        if hub is not None:
            dispatch = hub.dispatch_monitor_traffic
            hub.monitor.on_recv(lambda msg: None if is_iopub_welcome(msg) or expected_stops(hub, msg)
                                else dispatch(msg))   # neither is news to the hub

    def save_connection_dict(self, fname: str, cdict: dict[str, Any]) -> None:
        path = os.path.join(self.profile_dir.security_dir, fname)
        self.log.info("writing connection info to %s", path)
        fd, tmp = tempfile.mkstemp(dir=os.path.dirname(path), prefix=".tmp-", suffix=".json")
        try:
            os.fchmod(fd, stat.S_IRUSR | stat.S_IWUSR)
            with os.fdopen(fd, "w") as fh:
                fh.write(json.dumps(cdict, indent=2))
            os.replace(tmp, path)
        except BaseException:
            try:
                os.unlink(tmp)
            except OSError:
                pass
            raise


def is_iopub_welcome(frames: Sequence[object]) -> bool:
    """An engine's greeting to a new IOPub subscriber (ipykernel's XPUB, JEP 65).

    Meant for the subscriber, not traffic to record: ipyparallel 9's hub would log each one as
    "Monitor message without topic" (an ERROR at every rank's start).
    """
    # [topic, signature, header, ...]: the header is within the first frames; content (user text) is not
    return any(isinstance(f, bytes) and b'"msg_type": "iopub_welcome"' in f for f in frames[:4])


def expected_stops(hub: MonitorHub, frames: Sequence[object]) -> bool:
    """Whether these are the heart monitor's news that hearts stopped which all belong to engines
    unregistered on purpose (a restart's or a stop's): the hub would only log a warning for each,
    every restart, and do nothing else. Read without the signature check (the hub checks, once,
    what it is given; a message is signed once), as nothing is done with them."""
    if not frames or frames[0] != b"heartmonitor":
        return False
    try:
        _, parts = hub.session.feed_identities(frames[1:])
        header, content = hub.session.unpack(parts[1]), hub.session.unpack(parts[4])
        hearts = [h.encode("utf8") for h in content["hearts"]]
    except Exception:   # the hub's own handling reports what is wrong with it
        return False
    expected = hub.expect_stopped_hearts
    return header.get("msg_type") == "stopped_heart" and bool(hearts) and all(h in expected for h in hearts)


def watch_parent(poll: float = 0.5) -> threading.Thread:
    """SIGTERM this process once its parent has gone (it is then re-parented): the
    controller's own handler stops its children and removes its connection files."""
    parent = os.getppid()

    def watch() -> None:
        while os.getppid() == parent:
            time.sleep(poll)
        os.kill(os.getpid(), signal.SIGTERM)

    t = threading.Thread(target=watch, name="mlx-parent-watch", daemon=True)
    t.start()
    return t


def main() -> None:
    exit_unless_usable("controller")
    watch_parent()
    MLXController.launch_instance()


if __name__ == "__main__":
    main()
