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
    """IPEngine with the rank agent installed after registration.

    An agent that could not be installed is reported by :func:`rankside.agent_state`,
    which the cluster's start-up probe asks (start then fails naming the cause);
    an ipyparallel without ``complete_registration`` never calls it, which the probe
    reports too.
    """

    async def complete_registration(self, msg, connect, maybe_tunnel):  # type: ignore[override]
        await super().complete_registration(msg, connect, maybe_tunnel)
        if self.kernel is None:
            rankside.AGENT_ERROR = "the engine has no kernel after registration"
            return
        try:
            rankside.install(self.kernel, self.id if self.id is not None else rankside.env_rank())
        except Exception as exc:
            rankside.AGENT_ERROR = f"{type(exc).__name__}: {exc}"
            self.log.error("the MLX rank agent could not be installed: %s", rankside.AGENT_ERROR)


def main(argv: Optional[list[str]] = None) -> None:
    argv = list(sys.argv[1:] if argv is None else argv)
    pinned = [f"--IPEngine.id={rankside.env_rank()}", "--IPEngine.enable_nanny=False"]
    rankside.start_world_early()  # overlaps MLX's ring set-up with the engine's registration
    MLXEngine.launch_instance(argv=pinned + argv)


if __name__ == "__main__":
    main()
