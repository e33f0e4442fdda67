"""Code written for MLX on our groups: MLX's keyword arguments (stream=), send's lazy-array pattern,
recv_like; and MLX's backends' missing ops answered with what works instead."""

from __future__ import annotations

import pytest

from ranks import run

pytest.importorskip("mlx.core")

MLX_STYLE = """
import mlx.core as mx
group = dist.init(strict=True, timeout=60)
s = mx.default_stream(mx.cpu)
x = mx.ones(4) * (RANK + 1)
sums = [dist.all_sum(x, group=group, stream=st).tolist() for st in (None, s, mx.cpu, mx.Device(mx.cpu))]
mx_max = dist.all_max(x, stream=s).tolist()
mx_min = dist.all_min(x, stream=s).tolist()
gathered = dist.all_gather(x, stream=s).tolist()
scattered = dist.sum_scatter(mx.ones((2, 2)), stream=s).tolist()
if RANK == 0:
    sent = dist.send(mx.arange(3), 1, group=group, stream=s)       # MLX's pattern: evaluate what send returns
    mx.eval(sent)
    got = sent.tolist()
else:
    got = dist.recv_like(mx.zeros(3, dtype=mx.int32), 0, stream=s).tolist()
if RANK == 1:
    dist.send(mx.full((2,), 7.0), 0)
else:
    got2 = dist.recv((2,), mx.float32, 0 + 1, stream=s)
try:
    dist.all_sum(x, stream="gpu")
    bad = ""
except TypeError as exc:
    bad = str(exc)
report(sums=sums, mx_max=mx_max, mx_min=mx_min, gathered=gathered, scattered=scattered, got=got, bad=bad,
       got2=got2.tolist() if RANK == 0 else None, kind=type(dist.all_sum(x, stream=s)).__module__)
"""


@pytest.mark.timeout(120)
def test_code_written_for_mlx_runs_on_our_group() -> None:
    res = run(2, MLX_STYLE)
    for r, out in enumerate(res):
        assert out["sums"] == [[3.0] * 4] * 4 and out["mx_max"] == [2.0] * 4 and out["mx_min"] == [1.0] * 4
        assert out["gathered"] == [1.0] * 4 + [2.0] * 4 and out["scattered"] == [[2.0, 2.0]]
        assert out["got"] == [0, 1, 2] and out["kind"].startswith("mlx")
        assert "stream= takes an mx.Stream or mx.Device" in out["bad"] and "not str" in out["bad"]
    assert res[0]["got2"] == [7.0, 7.0]


# MLX's own ring group behind our API: the same wrapper serves its mpi, nccl and jaccl groups.
MLX_RING = """
import mlx.core as mx
from mlx_jupyter.collective.group import MlxGroup
g = MlxGroup.wrap(mx.distributed.init(strict=True, backend="ring"), "ring")
s = mx.default_stream(mx.cpu)
total = dist.all_sum(mx.ones(2) * (RANK + 1), group=g, stream=s).tolist()
part = dist.sum_scatter(mx.ones((2, 3)), group=g, stream=s).tolist()      # MLX's ring has none: all_sum + slice
try:
    g.split(0)
    split = ""
except NotImplementedError as exc:
    split = str(exc)
report(total=total, part=part, split=split)
"""


@pytest.mark.timeout(120)
def test_what_mlx_backends_lack_says_what_works_instead() -> None:
    for out in run(2, MLX_RING):
        assert out["total"] == [3.0, 3.0] and out["part"] == [[2.0, 2.0, 2.0]]
        assert "MLX's ring backend has no split" in out["split"] and "instead: our core's group" in out["split"]


def test_every_missing_op_of_mlx_backends_has_advice() -> None:
    """MLX's table (ring: split, sum_scatter; jaccl: split; nccl: send, recv; mpi: sum_scatter)."""
    from mlx_jupyter.collective.group import LACKS, lacks

    table = {"ring": {"split", "sum_scatter"}, "jaccl": {"split"}, "jaccl-ring": {"split"},
             "nccl": {"send", "recv"}, "mpi": {"sum_scatter"}}
    assert {(b, op) for b, ops in table.items() for op in ops} == set(LACKS)
    msg = str(lacks("nccl", "send", RuntimeError("[nccl] Send not supported in NCCL backend.")))
    assert msg.startswith("send: MLX's nccl backend has no send") and "all_gather" in msg and "our core's group" in msg


def test_an_mpi_world_of_one_is_no_launch() -> None:
    """mpirun -n 1: init("any") skips it (as MLX since #4210); init("mpi", strict=True) raises."""
    from mlx_jupyter.collective.group import MlxGroup
    from mlx_jupyter.vocab.rank_env import read

    assert read({"OMPI_COMM_WORLD_SIZE": "1"}).launchers == ()
    assert read({"PMI_SIZE": "1"}).launchers == ()
    assert read({"OMPI_COMM_WORLD_SIZE": "2"}).launchers == ("mpi",)

    class One:   # MLX's group of an mpi world of one, as an MLX before #4210 returns it
        def size(self) -> int:
            return 1

    with pytest.raises(RuntimeError, match="single process"):
        MlxGroup.wrap(One(), "mpi")
