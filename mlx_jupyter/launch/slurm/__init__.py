"""Ranks as a Slurm job step: the allocation (ours or the current one), srun, the contract, the ending.

:class:`~mlx_jupyter.launch.slurm.options.SlurmOptions` is what ``Launcher(slurm=...)``
and ``mlx-jupyter launch --slurm`` take; :mod:`.parse` reads Slurm's output (pure),
:mod:`.commands` runs Slurm's client commands, :mod:`.allocation` gets and releases
nodes, :mod:`.plan` and :mod:`.wrapper` give every task MLX's environment contract,
:mod:`.job` runs the step and :mod:`.ending` tells how it ended.
"""

from mlx_jupyter.launch.slurm.options import SlurmOptions

__all__ = ["SlurmOptions"]
