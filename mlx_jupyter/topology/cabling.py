"""What the planner (:mod:`.choice`) and the renderers (:mod:`.render_dot`, :mod:`.render_svg`) read
of a cabling. :class:`~mlx_jupyter.topology.topology.Topology` is one; they never import it."""

from __future__ import annotations

from typing import Optional, Protocol, Sequence

from .addressing import Link
from .model import Cable, MacHost
from .rings import Ring


class Cabling(Protocol):
    """Hosts in the user's order, the cables between them, and what follows from them."""

    hosts: list[MacHost]
    cables: list[Cable]

    @property
    def names(self) -> list[str]: ...

    @property
    def ips(self) -> list[Optional[str]]: ...

    @property
    def local_cables(self) -> list[Cable]: ...

    @property
    def foreign_cables(self) -> list[Cable]: ...

    def rings(self) -> Sequence[Ring]: ...

    def full_ring(self) -> Optional[Ring]: ...

    def missing_pairs(self) -> list[tuple[int, int]]: ...

    def links(self) -> list[Link]: ...
