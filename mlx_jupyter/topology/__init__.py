"""Thunderbolt cabling of a Mac cluster: parsing, the model, rings/mesh, address plan, renderings.

Pure logic: command outputs come in as data (`CommandResult`), plans go out as data.
`Topology.from_recordings(folder)` is the one entry point that reads files.
"""

from __future__ import annotations

from .choice import CONFIG_BACKENDS, Choice
from .commands import CommandResult
from .topology import Topology
from .errors import DiscoveryError, PlanError, TopologyError
from .model import Cable, End, MacHost, Port
from .netparse import IfAddr, RdmaStatus
from .recordings import Recording
from .rings import Ring
from .system_profiler import Peer

__all__ = [
    "CONFIG_BACKENDS", "Cable", "Choice", "CommandResult", "DiscoveryError", "End", "IfAddr", "MacHost", "Peer",
    "PlanError", "Port", "RdmaStatus", "Recording", "Ring", "Topology", "TopologyError",
]
