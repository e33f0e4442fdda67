"""The environment contract under Slurm (pure): the allocation's nodes in, srun's one environment out.

:func:`mlx_jupyter.launch.contract.plan_ranks` plans per rank, as for ssh
launches; srun gives every task the same environment, so the plan must differ
between ranks only in what the task wrapper derives from Slurm's variables
(``MLX_RANK``, ``CUDA_VISIBLE_DEVICES``). Rank r runs on node r // per_node
(srun's block distribution, checked on the node by the wrapper).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Mapping, Optional, Sequence

from mlx_jupyter.vocab.backends import get
from mlx_jupyter.hostfile import Host
from mlx_jupyter.launch import contract
from mlx_jupyter.vocab import rank_env
from mlx_jupyter.launch.slurm.wrapper import control_env
from mlx_jupyter.vocab.ports import CORE_PORT_OFFSET, DEFAULT_NCCL_PORT

#: Derived ring ports live in [PORT_BASE, PORT_BASE + CORE_PORT_OFFSET), our core's the same + the offset:
#: below Linux's ephemeral range (32768), so outgoing connections never take them.
PORT_BASE = 20000
#: What the wrapper sets per rank from Slurm's variables.
PER_RANK = (rank_env.RANK, "CUDA_VISIBLE_DEVICES")


@dataclass
class StepPlan:
    """srun's environment (on top of ours) and the rank -> node map it implies."""

    hosts: list[Host]
    env: dict[str, str] = field(default_factory=dict)

    @property
    def nodes(self) -> list[str]:
        return [h.ssh for h in self.hosts]


def derived_port(job_id: int, size: int, connections_per_ip: int = 1) -> int:
    """A ring starting port from the job id, so that jobs sharing a node use different ports.

    The band [PORT_BASE, PORT_BASE + CORE_PORT_OFFSET) is cut into blocks of ``size *
    connections_per_ip`` ports; consecutive jobs take consecutive blocks, wrapping round.
    Our core's block is the same + CORE_PORT_OFFSET, so the two bands never meet.
    """
    need = size * connections_per_ip
    slots = CORE_PORT_OFFSET // need
    if slots < 1:
        raise contract.ContractError(f"{size} ranks need {need} ring ports, more than a derived block holds "
                                     f"({CORE_PORT_OFFSET}); choose them with --starting-port")
    return PORT_BASE + (job_id % slots) * need


def rank_hosts(nodes: Sequence[str], ips: Mapping[str, str], per_node: int) -> list[Host]:
    """One :class:`Host` per rank, ``per_node`` in a row on each node (srun's block distribution)."""
    return [Host(node, [ips[node]]) for node in nodes for _ in range(per_node)]


def plan_step(
    backend: str,
    hosts: Sequence[Host],
    *,
    env: Mapping[str, str],
    token: str,
    starting_port: int,
    connections_per_ip: int = 1,
    nccl_port: int = DEFAULT_NCCL_PORT,
    verbose: bool = False,
    mpi_env: Optional[Mapping[str, str]] = None,
    frame_with: Optional[str] = None,
) -> StepPlan:
    """srun's environment for ``backend`` on ``hosts`` (one per rank): the contract plus the wrapper's controls.

    ``mpi_env``: for the mpi backend, :func:`contract.plan_mpi`'s environment (MPI itself numbers the ranks).
    ``frame_with``: the Python the wrapper relays the ranks' output with, in pieces as it comes (:mod:`.framer`).
    """
    nodes = [h.ssh for h in hosts]
    if get(backend).mpirun:
        base = dict(mpi_env or {})
        base.setdefault(rank_env.TOKEN, token)
        return StepPlan(list(hosts), {**base, **control_env(nodes, set_rank=False, set_gpu=False, files={},
                                                                frame_with=frame_with)})
    plans = contract.plan_ranks(backend, hosts, env=env, token=token, starting_port=starting_port,
                                connections_per_ip=connections_per_ip, nccl_port=nccl_port, verbose=verbose)
    common = {k: v for k, v in plans[0].env.items() if k not in PER_RANK}
    for p in plans:
        if {k: v for k, v in p.env.items() if k not in PER_RANK} != common or p.files != plans[0].files:
            raise contract.ContractError(f"{backend}: rank {p.rank}'s environment differs from rank 0's beyond "
                                         f"{', '.join(PER_RANK)}; srun cannot give it")
    gpu = any("CUDA_VISIBLE_DEVICES" in p.env for p in plans)
    controls = control_env(nodes, set_rank=True, set_gpu=gpu, files=plans[0].files, frame_with=frame_with)
    return StepPlan(list(hosts), {**common, **controls})
