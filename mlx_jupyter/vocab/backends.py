"""One record per backend a launch can start: what it plans, needs and supports (pure data).

Whatever differs between backends is a field here; the launcher, the contract, the cluster and
the rank side ask :func:`get` instead of comparing names. How to add one: docs/architecture.md.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Mapping, Optional

#: ``init(backend=...)``'s name for "whichever launch environment is present" (not a backend)
ANY = "any"


@dataclass(frozen=True)
class Backend:
    """One backend's behaviour, as every layer asks it."""

    name: str
    #: which part of MLX's launch contract ``launch/contract.py`` plans: ring, jaccl, nccl or mpi
    contract: str
    #: which ranks need an IP address: "every" rank, the "first" (a coordinator) or "none" (mpirun resolves)
    addresses: str
    #: the RDMA devices it needs between hosts: "every" pair (jaccl), "neighbours" on a ring (jaccl-ring), ""
    rdma: str = ""
    #: one ``mpirun`` starts every rank and MPI numbers them (srun's MPI plugin under Slurm)
    mpirun: bool = False
    #: ``distributed.init`` forms its world on our core (a ``CoreGroup``), not as MLX's group (``MlxGroup``)
    core: bool = False
    #: a rank blocked in one of its collectives can be interrupted (else it cannot be cancelled)
    abortable: bool = False
    #: a cluster begins forming MLX's world right after its ranks start
    early_world: bool = False
    #: a machine may lack it: the launcher probes it (``distributed.backends()``) before starting ranks
    checked: bool = False
    #: one srun step can give its contract (jaccl needs each host's RDMA devices from a hostfile)
    slurm: bool = False
    #: JACCL's bootstrap may run over our core's ring (``all_gather_factory``)
    side_channel: bool = False
    #: the configurator (``mlx-jupyter config``) plans its cabling
    configurable: bool = False
    #: the fewest processes MLX forms its world of
    min_world: int = 1
    #: the name ``mx.distributed.init`` takes, and what it sets in the environment first
    mlx_name: str = ""
    mlx_env: Mapping[str, str] = field(default_factory=dict)
    #: how to get an MLX build that has it
    install: str = ""
    #: its part of the default rule: "cuda" (chosen on a machine with CUDA), "otherwise" (the fallback), ""
    default_when: str = ""
    #: the MLX calls a drain may make on a stopped rank, with zeros of the recorded dtype and shape, so that
    #: a peer blocked in one completes (docs/debugging.md); any other op pending falls back to the shutdown
    #: of MLX's world. A send is drained by its partner's recv (the data is dropped), a recv by a send of
    #: zeros that the blocked rank never returns to its code (it stops first), as a collective's.
    drain_ops: tuple[str, ...] = ("all_sum", "all_gather", "all_max", "all_min", "sum_scatter", "send", "recv")
    #: the ops MLX's own group of this backend lacks (MLX's table), each with what works instead: an
    #: ``MlxGroup`` says it in the error for that op
    lacks: Mapping[str, str] = field(default_factory=dict)


_JACCL_FIX = "pip install -U 'mlx>=0.29' on macOS 26.2+: JACCL ships in MLX's macOS wheels"
_SLICE = "all_sum then this rank's slice of axis 0 (done for you by mlx_jupyter.distributed.sum_scatter)"
_JACCL_SPLIT = ("our core's group has split: mlx_jupyter.distributed.init(backend=\"ring\") forms it over the "
                "ring mlx-jupyter plans beside JACCL (MLX_JUPYTER_HOSTFILE)")
_NCCL_P2P = ("NCCL's backend in MLX has no point to point: all_gather and take rank src's slice, or use "
             "our core's group (mlx_jupyter.distributed.init(backend=\"ring\") on a ring launch), which has send/recv")

RECORDS: tuple[Backend, ...] = (
    Backend("ring", contract="ring", addresses="every", core=True, abortable=True, early_world=True, slurm=True,
            configurable=True, install="pip install -U 'mlx>=0.29'", default_when="otherwise",
            lacks={"split": "our core's group (mlx_jupyter.distributed.init()) has split", "sum_scatter": _SLICE}),
    Backend("jaccl", contract="jaccl", addresses="first", rdma="every", checked=True, side_channel=True, configurable=True,
            install=_JACCL_FIX, lacks={"split": _JACCL_SPLIT}),
    Backend("jaccl-ring", contract="jaccl", addresses="first", rdma="neighbours", checked=True, side_channel=True, configurable=True,
            mlx_name="jaccl", mlx_env={"MLX_JACCL_RING": "1"}, install=_JACCL_FIX, lacks={"split": _JACCL_SPLIT}),
    Backend("nccl", contract="nccl", addresses="first", checked=True, slurm=True,
            install="pip install 'mlx[cuda12]' (or 'mlx[cuda13]'): the CPU-only MLX wheel has no NCCL",
            default_when="cuda", lacks={"send": _NCCL_P2P, "recv": _NCCL_P2P}),
    Backend("mpi", contract="mpi", addresses="none", mpirun=True, slurm=True, min_world=2,
            install="use an MLX build with MPI support (MLX's pip wheels load libmpi at run time)",
            lacks={"sum_scatter": _SLICE}),
)
_BY_NAME = {b.name: b for b in RECORDS}
#: every backend's name, in the order help texts list them
NAMES: tuple[str, ...] = tuple(_BY_NAME)


def find(name: Optional[str]) -> Optional[Backend]:
    """The record of ``name`` (None for an unknown name, ``"any"`` or None)."""
    return _BY_NAME.get(name or "")


def get(name: str) -> Backend:
    """The record of ``name``; ValueError naming the valid ones."""
    record = find(name)
    if record is None:
        raise ValueError(f"unknown backend {name!r}: valid names are {', '.join(NAMES)}")
    return record


def mlx_name(name: str) -> str:
    """The name MLX's ``init`` takes for ``name`` (``jaccl-ring``: ``jaccl``)."""
    record = find(name)
    return (record.mlx_name or record.name) if record is not None else name


def listed(names: tuple[str, ...] = NAMES, last: str = "or") -> str:
    """``ring, jaccl, jaccl-ring, nccl or mpi``: names for a help text."""
    return ", ".join(names[:-1]) + f" {last} {names[-1]}" if len(names) > 1 else "".join(names)


def _has_cuda() -> bool:
    try:
        import mlx.core as mx

        return bool(mx.cuda.is_available())
    except Exception:  # no MLX here, or an MLX without its cuda module
        return False


def default_backend() -> str:
    """The backend when neither the caller nor the hostfile names one, for every way in (``launch``,
    ``Launcher``, ``Cluster``, ``%mlx_cluster``, the panel): the record whose ``default_when`` holds,
    "cuda" first (nccl with CUDA, as ``mlx.launch``), else the "otherwise" one (ring)."""
    holds: dict[str, Callable[[], bool]] = {"cuda": _has_cuda, "otherwise": lambda: True}
    for when in ("cuda", "otherwise"):
        for record in RECORDS:
            if record.default_when == when and holds[when]():
                return record.name
    return RECORDS[0].name


#: the default rule in words, for help texts
DEFAULT_RULE = "the hostfile's, else " + ", else ".join(
    [f"{b.name} with CUDA" for b in RECORDS if b.default_when == "cuda"] +
    [b.name for b in RECORDS if b.default_when == "otherwise"])
