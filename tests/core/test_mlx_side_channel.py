"""JACCL's bootstrap over our core's ring (core/side_channel.py), through MLX's own entry point as far as
Linux goes: MLX takes the factory, and each gather gives what JACCL's SideChannel expects."""

from __future__ import annotations

import pytest

from ranks import run

pytest.importorskip("mlx.core")

# What JACCL's SideChannel does with the gather (mlx/distributed/jaccl/lib/jaccl/rdma.h), and what MLX's
# binding checks of it (python/src/distributed.cpp): bytes of size * n_bytes, rank r's at r * n_bytes.
JACCL_SIDE = """
import struct
import mlx.core as mx
from mlx_jupyter.collective import side_channel

factory = dist.all_gather_factory()
gather = factory(RANK, 2)                     # MLX calls factory(rank, size) once
assert callable(gather)

def checked(src):
    out = gather(src, len(src))
    assert isinstance(out, bytes) and len(out) == 2 * len(src), (type(out), len(out))
    return out

lengths = struct.unpack("<2i", checked(struct.pack("<i", 3 + RANK)))           # all_gather<int>(v.size())
width = max(lengths)
mine = bytes([65 + RANK] * (3 + RANK)).ljust(width, b"\\0")                   # the container, padded
rows = checked(mine)
infos = [rows[r * width:r * width + lengths[r]].decode() for r in range(2)]
for _ in range(2):                                                            # barrier(): two int gathers
    checked(struct.pack("<i", 0))
empty = checked(b"")
boot = side_channel.bootstrap_group()
try:
    factory(1 - RANK, 2)
    mismatch = ""
except RuntimeError as exc:
    mismatch = str(exc)
# MLX's own init takes the factory; on Linux its jaccl is the stub (no RDMA): a singleton, or its error
single = mx.distributed.init(backend="jaccl", all_gather_factory=factory).size()
try:
    mx.distributed.init(strict=True, backend="jaccl", all_gather_factory=factory)
    strict = ""
except RuntimeError as exc:
    strict = str(exc)
try:
    dist.init(backend="ring", all_gather_factory=factory)
    wrong_backend = ""
except ValueError as exc:
    wrong_backend = str(exc)
world = dist.init(backend="ring")           # the bootstrap's ring becomes the world, not a second one
report(lengths=list(lengths), infos=infos, empty=len(empty), same=world is boot, size=world.size(),
       mismatch=mismatch, single=single, strict=strict, wrong_backend=wrong_backend)
"""


@pytest.mark.timeout(120)
def test_the_factory_gathers_what_jaccl_exchanges_over_our_signed_ring() -> None:
    res = run(2, JACCL_SIDE)
    for r in res:
        assert r["lengths"] == [3, 4] and r["infos"] == ["AAA", "BBBB"] and r["empty"] == 0
        assert r["same"] and r["size"] == 2
        assert "JACCL is rank" in r["mismatch"] and "different ranks" in r["mismatch"]
        assert r["single"] == 1 and "jaccl" in r["strict"]
        assert "only supported with backend='jaccl'" in r["wrong_backend"]


def test_who_bootstraps_over_our_core() -> None:
    from mlx_jupyter.collective.side_channel import wants_side_channel
    from mlx_jupyter.vocab.rank_env import read

    devices = {"MLX_IBV_DEVICES": "/tmp/d.json", "MLX_RANK": "1"}
    core = {**devices, "MLX_JUPYTER_HOSTFILE": "/tmp/core.json"}
    assert wants_side_channel("jaccl", read(core)) and wants_side_channel("jaccl-ring", read(core))
    assert wants_side_channel("any", read(core))                      # the only launch found is jaccl's
    assert not wants_side_channel("jaccl", read({**core, "MLX_JACCL_COORDINATOR": "10.0.0.1:1"}))
    assert not wants_side_channel("jaccl", read(devices))             # no core ring: MLX's own error
    assert not wants_side_channel("ring", read(core))


def test_mlx_world_without_a_core_ring_leaves_jaccl_to_mlx(monkeypatch: pytest.MonkeyPatch) -> None:
    """No coordinator and no core ring: MLX's own init is called as is (on Linux: its stub's singleton)."""
    from mlx_jupyter.collective.side_channel import mlx_world

    for var in ("MLX_RANK", "MLX_HOSTFILE", "MLX_JUPYTER_HOSTFILE", "MLX_JACCL_COORDINATOR", "JACCL_COORDINATOR"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("JACCL_IBV_DEVICES", "/nonexistent.json")
    assert mlx_world(strict=False, backend="jaccl").size() == 1
    with pytest.raises(ValueError, match="jaccl backend only"):
        mlx_world(strict=False, backend="mpi", factory=lambda rank, size: None)


LATE_PEER = """
gather = dist.all_gather_factory(timeout=2)(RANK, 2)      # both ranks form the ring; only rank 0 gathers
if RANK == 0:
    t = time.monotonic()
    try:
        gather(b"x", 1)
        err = ""
    except dist.CommTimeoutError as exc:
        err = str(exc)
    report(err=err, took=time.monotonic() - t)
else:
    sys.stdin.read()                                          # until the test closes our stdin
    report(err="")
"""


@pytest.mark.timeout(120)
def test_a_gather_whose_peer_never_comes_times_out() -> None:
    from ranks import Ranks

    with Ranks(2, LATE_PEER) as ranks:
        ranks.start()
        out, _ = ranks.procs[0].communicate(timeout=60)
        ranks.procs[1].stdin.close()
        first = [line for line in out.splitlines() if line.startswith("RESULT ")]
        assert first, out
        import json

        res = json.loads(first[-1][7:])
        assert res["err"] and res["took"] < 30, res
