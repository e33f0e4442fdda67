"""Where a cluster is driven from (plain Python, the magics, the lab panel): what its messages tell
the user to do for fresh ranks, and whose the panel's listing says it is. Given when a handle is
made (``Cluster(context=...)``, ``Cluster.connect(context=...)``), never changed afterwards."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional


@dataclass(frozen=True)
class RestartContext:
    """``command``: the restart that works where the messages are shown; ``magics``: they are
    shown under the magics (whose words they use); ``publish_as``: the registry's owner;
    ``failed_advice``: what a failed restart says to do next (None: from ``command``)."""

    command: str
    magics: bool = False
    publish_as: str = "kernel"
    failed_advice: Optional[str] = None

    def after_failed_restart(self) -> str:
        """What works after a restart that failed once the old ranks were stopped."""
        if self.failed_advice is not None:
            return self.failed_advice
        if self.magics:
            return ("fix the cause, then %mlx_cluster restart (the ranks start empty), "
                    "or %mlx_cluster stop and %mlx_cluster start")
        return f"fix the cause, then {self.command} (the ranks start empty), or cluster.stop() and cluster.start()"

    def after_unstarted_restart(self) -> str:
        """What works after a restart that failed before it stopped any rank (they keep their names)."""
        if self.failed_advice is not None:   # the panel's cluster: its Restart button keeps names, Stop ends it
            return "press Restart again once the cause is gone, or Stop it and start a new cluster"
        clean = "%mlx_cluster restart --clean" if self.magics else "cluster.restart(clean=True)"
        return f"restart again once the cause is gone (it keeps the names), or {clean} to start the ranks empty"

    def after_owner_stopped(self, cluster_id: str) -> str:
        """For a connected handle whose owner stopped the cluster: what works from here."""
        if self.magics:
            return (f"{cluster_id} was stopped where it was started: %mlx_cluster stop here, then "
                    "%mlx_cluster start (or start one in the MLX Cluster panel and connect to it)")
        return (f"{cluster_id} was stopped where it was started: cluster.stop(), then start a Cluster "
                "of your own or Cluster.connect() to another")


#: a cluster used from plain Python (``cluster.restart()``)
PYTHON = RestartContext("cluster.restart()")
#: the magics' cluster (``%mlx_cluster start``, ``%mlx_cluster connect``)
MAGICS = RestartContext("%mlx_cluster restart", magics=True)
#: the lab panel's cluster, which the server owns: a failed restart leaves a card that offers Dismiss
PANEL = RestartContext("cluster.restart()", publish_as="server",
                       failed_advice="dismiss it in the MLX Cluster panel and start a new cluster")


#: what a restart keeps, in the one wording of the owner's cell, a connected notebook's and the panel's card
KEEPS = "it keeps the ranks' names"


def owner_restart(by_server: bool) -> str:
    """How a cluster seen from elsewhere than its owner gets fresh ranks (a connected notebook, the lab panel for a
    kernel's cluster): only where the owner is; ``by_server``: the panel's server owns it."""
    if by_server:
        return f"restart it with the Restart button of the MLX Cluster panel ({KEEPS})"
    return f"restart it in that kernel's notebook with %mlx_cluster restart ({KEEPS})"
