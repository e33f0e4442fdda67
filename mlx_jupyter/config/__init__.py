"""`mlx-jupyter config`: discover the cabling, plan addresses, set the hosts up, write a hostfile."""

from __future__ import annotations

from mlx_jupyter.config.cli import *  # noqa: F401,F403
from mlx_jupyter.config.cli import main  # noqa: F401
