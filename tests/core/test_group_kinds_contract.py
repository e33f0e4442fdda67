"""The public API's contract, the same tests for every kind of group that runs here (issue 21, item 6).

`mlx_jupyter.distributed`'s ops take numpy, MLX and torch arrays and answer in the input's type;
`out=` is written in place and returned; a bad `out=` or peer is a ValueError that leaves the group
working; `recv` gives the requested array kind. Checked on our core over TCP and over shared
memory, on MLX's ring group and on MLX's mpi group (under mpirun), 2 ranks each, started by our
launcher as a user would.
"""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import sys
import threading
from pathlib import Path

import pytest

from needs import require, require_core, under_ci
from mlx_jupyter.launch import Launcher
from mlx_jupyter.vocab.ports import free_port_block

pytestmark = pytest.mark.timeout(150)
ROOT = Path(__file__).resolve().parents[2]

CONTRACT = r"""
import json, os, sys
import numpy as np
import mlx.core as mx
from mlx_jupyter import distributed as dist
from mlx_jupyter.collective.group import MlxGroup
try:
    import torch
except ImportError:
    torch = None

KIND = os.environ["CONTRACT_KIND"]
if KIND.startswith("core"):
    g = dist.init(strict=True, backend="ring", timeout=30)
elif KIND == "mlx-ring":
    g = MlxGroup.form("ring")
else:
    g = dist.init(strict=True, backend="mpi")
R, N = g.rank(), g.size()
checked = []

def ok(name, cond, detail=""):
    assert cond, f"{KIND} rank {R}: {name} {detail}"
    checked.append(name)

def refused(name, fn, kind=ValueError, match=""):
    try:
        fn()
    except kind as exc:
        ok(name, match in str(exc), f"says {exc}")
        return
    raise AssertionError(f"{KIND} rank {R}: {name}: no {kind.__name__}")

def same(got, want):
    got = np.asarray(got.float() if torch is not None and isinstance(got, torch.Tensor) and got.dtype == torch.bfloat16
                     else got.astype(mx.float32) if isinstance(got, mx.array) and got.dtype == mx.bfloat16 else got)
    return got.shape == want.shape and np.allclose(got.astype(np.float64), want.astype(np.float64))

def check_types(name, got, want, like):
    if isinstance(like, np.ndarray):
        ok(name + " numpy", isinstance(got, np.ndarray) and got.dtype == want.dtype and same(got, want), repr(got))
    elif isinstance(like, mx.array):
        ok(name + " mlx", isinstance(got, mx.array) and got.dtype == like.dtype and same(got, want), repr(got))
    else:
        ok(name + " torch", isinstance(got, torch.Tensor) and got.dtype == like.dtype and same(got, want), repr(got))

def kinds(a):
    # the same values as numpy, MLX and torch inputs
    out = [a, mx.array(a)]
    if torch is not None:
        out.append(torch.from_numpy(a.copy()))
    return out

def outs(shape, dtype):
    # out= buffers the caller may pass: numpy and torch (MLX arrays are immutable)
    out = [np.full(shape, 99, dtype)]
    if torch is not None:
        out.append(torch.from_numpy(np.full(shape, 99, dtype)))
    return out

REDUCE = {"all_sum": lambda ps: sum(ps[1:], ps[0]), "all_max": lambda ps: np.maximum.reduce(ps),
          "all_min": lambda ps: np.minimum.reduce(ps)}
for dt in ("float32", "int32", "float16", "int64", "uint8"):
    parts = [(np.arange(6).reshape(3, 2) * (r + 1) - r).astype(dt) for r in range(N)]
    mine = parts[R]
    for op, fn in REDUCE.items():
        want = fn(parts).astype(dt)
        for x in kinds(mine):
            check_types(f"{op} {dt}", getattr(dist, op)(x, group=g), want, x)
        for out in outs(want.shape, dt):
            ok(f"{op} {dt} out=", getattr(dist, op)(mine, group=g, out=out) is out and same(out, want), repr(out))
    gathered = np.concatenate(parts)
    for x in kinds(mine):
        check_types(f"all_gather {dt}", dist.all_gather(x, group=g), gathered, x)
    for out in outs(gathered.shape, dt):
        ok(f"all_gather {dt} out=", dist.all_gather(mine, group=g, out=out) is out and same(out, gathered), repr(out))
    tall = [np.concatenate([p] * N) for p in parts]   # axis 0 divisible by N
    total = sum(tall[1:], tall[0]).astype(dt)
    mine_slice = total[R * 3:(R + 1) * 3]
    for x in kinds(tall[R]):
        check_types(f"sum_scatter {dt}", dist.sum_scatter(x, group=g), mine_slice, x)
    for out in outs(mine_slice.shape, dt):
        ok(f"sum_scatter {dt} out=", dist.sum_scatter(tall[R], group=g, out=out) is out and same(out, mine_slice))

# a 0-d input gathers to one element per rank
ok("all_gather 0-d", same(dist.all_gather(np.float32(R), group=g), np.arange(N, dtype=np.float32)))

# bfloat16 (no numpy dtype): MLX and torch in, the same type out, and torch out=
b = mx.arange(4, dtype=mx.bfloat16) * (R + 1)
want = np.arange(4) * sum(range(1, N + 1))
ok("all_sum bfloat16 mlx", (r := dist.all_sum(b, group=g)).dtype == mx.bfloat16 and same(r, want))
if torch is not None:
    tb = torch.arange(4, dtype=torch.bfloat16) * (R + 1)
    ok("all_sum bfloat16 torch", (r := dist.all_sum(tb, group=g)).dtype == torch.bfloat16 and same(r, want))
    tout = torch.zeros(4, dtype=torch.bfloat16)
    ok("all_sum bfloat16 out=", dist.all_sum(tb, group=g, out=tout) is tout and same(tout, want))

# a bad out= or peer is a ValueError before anything is sent, and the group goes on working
x = np.ones(4, np.float32)
refused("all_sum out= wrong size", lambda: dist.all_sum(x, group=g, out=np.zeros(5, np.float32)), match="out=")
refused("all_sum out= wrong dtype", lambda: dist.all_sum(x, group=g, out=np.zeros(4, np.int32)), match="out=")
refused("all_gather out= wrong size", lambda: dist.all_gather(x, group=g, out=np.zeros(4, np.float32)), match="out=")
refused("sum_scatter out= wrong size", lambda: dist.sum_scatter(np.ones(2 * N, np.float32), group=g,
                                                                 out=np.zeros(1, np.float32)), match="out=")
refused("out= an MLX array", lambda: dist.all_sum(x, group=g, out=mx.zeros(4)), TypeError, "immutable")
refused("send to a rank past the end", lambda: dist.send(x, N + 3, group=g), match=f"dst={N + 3} is not a rank")
refused("recv from a negative rank", lambda: dist.recv(4, np.float32, -1, group=g), match="src=-1 is not a rank")
refused("recv out= wrong size", lambda: dist.recv(4, np.float32, 1 - R, group=g, out=np.zeros(3, np.float32)),
        match="out=")
refused("split color past 32 bits", lambda: g.split(2**40), match="color=1099511627776 does not fit in 32 bits")
refused("split key not an int", lambda: g.split(0, key="a"), TypeError, "key must be an int")
ok("the group still works", same(dist.all_sum(x, group=g), np.full(4, N, np.float32)))

# send/recv between ranks 0 and 1: recv answers in the requested kind, or into out=
def payload(i):
    return (np.arange(6, dtype=np.float32) + 100 * i).reshape(2, 3)

want_kinds = [("numpy dtype", np.float32, np.ndarray), ("name", "float32", np.ndarray), ("mlx dtype", mx.float32, mx.array)]
if torch is not None:
    want_kinds.append(("torch dtype", torch.float32, torch.Tensor))
for i, (label, dtype, typ) in enumerate(want_kinds):
    if R == 0:
        dist.send(payload(i), 1, group=g)
    elif R == 1:
        got = dist.recv((2, 3), dtype, 0, group=g)
        ok(f"recv {label}", isinstance(got, typ) and same(got, payload(i)), repr(got))
for i, out in enumerate(outs((2, 3), np.float32)):
    if R == 0:
        dist.send(mx.array(payload(10 + i)), 1, group=g)
    elif R == 1:
        ok("recv out=", dist.recv((2, 3), np.float32, 0, group=g, out=out) is out and same(out, payload(10 + i)))
if R == 1:
    dist.send(payload(20), 0, group=g)
elif R == 0:
    got = dist.recv_like(mx.zeros((2, 3)), 1, group=g)
    ok("recv_like mlx", isinstance(got, mx.array) and same(got, payload(20)))
g.barrier()
print("RESULT " + json.dumps({"rank": R, "size": N, "checked": len(checked), "torch": torch is not None,
                              "links": g.link_kinds() if hasattr(g, "link_kinds") else None}), flush=True)
"""

KINDS = {
    "core-tcp": {"backend": "ring", "env": {"MLX_JUPYTER_TRANSPORT": "tcp"}},
    "core-shm": {"backend": "ring", "env": {"MLX_JUPYTER_TRANSPORT": "auto"}},
    "mlx-ring": {"backend": "ring", "env": {}},
    "mlx-mpi": {"backend": "mpi", "env": {"OMPI_ALLOW_RUN_AS_ROOT": "1", "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM": "1"}},
}


def run_contract(kind: str, n: int = 2, timeout: float = 120) -> list[dict]:
    spec = KINDS[kind]
    lines: list[tuple[int, str, str]] = []
    lock = threading.Lock()

    def on_output(rank: int, stream: str, line: str) -> None:
        with lock:
            lines.append((rank, stream, line))

    env = {**spec["env"], "CONTRACT_KIND": kind, "MLX_JUPYTER_TIMEOUT": "60",
           "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH", "")]))}
    launcher = Launcher([sys.executable, "-c", CONTRACT], hosts="127.0.0.1", repeat_hosts=n, backend=spec["backend"],
                        env=env, starting_port=free_port_block(n), on_output=on_output)
    launcher.start()
    try:
        code = launcher.wait(timeout)
    finally:
        launcher.stop()
    text = "\n".join(f"[{r}:{s}] {line}" for r, s, line in lines)
    assert code == 0, f"{kind}: exit {code}\n{text[-6000:]}"
    results = [json.loads(line[7:]) for _, s, line in lines if s == "stdout" and line.startswith("RESULT ")]
    assert sorted(r["rank"] for r in results) == list(range(n)), text[-6000:]
    return results


@pytest.mark.parametrize("kind", list(KINDS))
def test_the_api_contract_holds_on_every_kind_of_group(kind):
    if kind == "mlx-mpi":
        require("mpirun", None if shutil.which("mpirun") else "not installed (apt-get install openmpi-bin)")
    require_core()
    has_torch = importlib.util.find_spec("torch") is not None
    if under_ci():   # locally the contract is checked without torch's inputs; CI has torch
        require("torch", None if has_torch else "not installed (.ci/run installs it)")
    results = run_contract(kind)
    # numpy and MLX inputs make 89-92 checks per rank; torch's inputs, out= and bfloat16 add 10 more
    floor = 100 if has_torch else 85
    assert all(r["size"] == 2 and r["torch"] == has_torch and r["checked"] >= floor for r in results), results
    if kind.startswith("core"):   # the kind is what its name says
        want = "tcp" if kind == "core-tcp" else "shm"
        assert all(r["links"] and all(k.endswith(":" + want) for k in r["links"]) for r in results), results
    else:
        assert all(r["links"] is None for r in results), results
