"""`python -m mlx_jupyter.engine`: an ipyparallel engine whose id is this process's MLX rank.

The launcher sets the environment contract (``MLX_RANK`` ...); this module
requests that rank as the engine id, turns off the per-engine nanny process
(our launcher watches the processes), begins forming MLX's ring world in the
background, and installs the rank agent (:mod:`mlx_jupyter.rankside`) once the
engine's kernel exists.
"""

from __future__ import annotations

import sys
from typing import Optional

from ipyparallel.engine.app import IPEngine

from mlx_jupyter import rankside


class MLXEngine(IPEngine):
    """IPEngine with the rank agent installed after registration."""

    async def complete_registration(self, msg, connect, maybe_tunnel):  # type: ignore[override]
        await super().complete_registration(msg, connect, maybe_tunnel)
        if self.kernel is not None:
            rankside.install(self.kernel, self.id if self.id is not None else rankside.env_rank())


def main(argv: Optional[list[str]] = None) -> None:
    argv = list(sys.argv[1:] if argv is None else argv)
    pinned = [f"--IPEngine.id={rankside.env_rank()}", "--IPEngine.enable_nanny=False"]
    rankside.start_world_early()  # overlaps MLX's ring set-up with the engine's registration
    MLXEngine.launch_instance(argv=pinned + argv)


if __name__ == "__main__":
    main()
