"""One Group interface for the collectives: `CoreGroup` runs them on our native core,
`MlxGroup` on MLX's own mpi/nccl/jaccl groups (backends our core does not implement).

`mlx_jupyter.distributed` picks the group and calls these methods; it never asks
which kind of group it holds. MLX's collectives have no timeout and cannot be
aborted from outside: `timeout=` is not honoured on an MlxGroup. `stream=` has MLX's meaning on
an MlxGroup (the stream MLX computes the result on); our core moves the bytes itself, on the
calling thread, and gives back an evaluated array, so there it is only checked.
"""

from __future__ import annotations

# the kinds of group and what they share, each in its module; their names are imported from here
from mlx_jupyter.collective.core_group import CoreGroup as CoreGroup, core_options as core_options, form_ring as form_ring
from mlx_jupyter.collective.group_interface import OPS as OPS, Group as Group, check_int32 as check_int32
from mlx_jupyter.collective.group_interface import check_peer as check_peer, check_stream as check_stream
from mlx_jupyter.collective.group_interface import seconds as seconds
from mlx_jupyter.collective.mlx_group import LACKS as LACKS, MlxGroup as MlxGroup, lacks as lacks, mlx_init as mlx_init
