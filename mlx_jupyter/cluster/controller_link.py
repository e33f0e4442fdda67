"""The notebook's link to a cluster's ipyparallel controller: the client, and what we know of the
requests that went through it."""

from __future__ import annotations

from typing import Any, Callable, Iterable, Optional, Sequence

from mlx_jupyter.cluster.shared.errors import ClusterError
from mlx_jupyter.cluster.shared.ipp_compat import (
    client_streams, is_closed, requests_outstanding, send_control, send_execute, unregister,
)
from mlx_jupyter.cluster.shared.zmqwatch import watch_queues


class ControllerLink:
    """An ipyparallel client while the cluster runs (``client`` is None otherwise).

    Every request to the ranks that is not a cell on the direct channel goes through here:
    views for apply/push/pull, cells sent as ``execute_request``, and control messages.
    """

    def __init__(self, controller_gone: Callable[[], str] = lambda: "",
                 gone_advice: Callable[[], str] = lambda: "") -> None:
        self.client: Any = None
        #: start's probes the controller dropped: never answered, they are not requests a cell could overtake
        self.stray_probes: set[str] = set()
        #: why the controller is gone ("" while it runs, or when unknown; an owner's processes set their guard's)
        self.controller_gone = controller_gone
        #: what to do about it, as it works where the message is shown
        self.gone_advice = gone_advice

    def need(self) -> Any:
        """The client; a clear error when the cluster is not running."""
        if self.client is None:
            raise ClusterError("no cluster is running: start one with %mlx_cluster start (or Cluster.start())")
        gone = self.controller_gone()
        if gone:
            raise ClusterError(f"{gone}: the ranks cannot be reached through it; {self.gone_advice()}")
        return self.client

    @property
    def closed(self) -> bool:
        return is_closed(self.client)

    def attach(self, client: Any) -> None:
        """Use ``client``, with its sockets watched for messages left unread."""
        self.client = client
        watch_queues(client_streams(client))

    def view(self, ranks: Sequence[int] | int) -> Any:
        """A non-blocking DirectView on ``ranks``."""
        return self.need().direct_view(targets=ranks)

    def ids(self) -> list[int]:
        return list(self.client.ids) if self.client is not None else []

    def requests_on(self, ranks: Sequence[int]) -> bool:
        """Whether a request sent through the controller (``%px``, a non-blocking apply) is
        unanswered on one of ``ranks`` (unknowable: True)."""
        return requests_outstanding(self.client, ranks, ignore=self.stray_probes)

    def send_execute(self, rank: int, code: str, hook: Callable[[Any], None], cell_number: int = 0,
                     first_line: int = 1) -> str:
        """Send ``code`` to ``rank`` as an ``execute_request``; see :func:`ipp_compat.send_execute`."""
        return send_execute(self.client, rank, code, hook, cell_number, first_line)

    def send_control(self, rank: int, msg_type: str, content: dict[str, Any]) -> Any:
        """``msg_type`` to ``rank``'s control channel; a future of the reply."""
        return send_control(self.client, rank, msg_type, content)

    def outstanding(self, msg_id: str) -> bool:
        return self.client is not None and msg_id in self.client.outstanding

    def unregister(self, ranks: Iterable[int]) -> None:
        """Tell the hub these engines are gone, so that their ids are free at once."""
        unregister(self.client, ranks)

    def close(self) -> None:
        client, self.client = self.client, None
        if client is not None:
            try:
                client.close(linger=0)
            except Exception:
                pass

    def __repr__(self) -> str:
        state: Optional[str] = "closed" if self.client is None else f"ids {self.ids()}"
        return f"<ControllerLink {state}>"
