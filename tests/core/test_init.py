"""init(): the cached first group, strict errors, malformed hostfiles, and what backends() says here."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

PRELUDE = """
import json
from mlx_jupyter import distributed as dist
def report(**kw):
    print("RESULT " + json.dumps(kw), flush=True)
"""


def _python(code: str, env: dict[str, str]) -> dict:
    """Runs `code` in a fresh interpreter whose only launch variables are `env`."""
    clean = {k: v for k, v in os.environ.items()
             if not k.startswith(("MLX_", "OMPI_", "PMI_", "NCCL_", "JACCL_"))}
    p = subprocess.run([sys.executable, "-c", PRELUDE + code], env={**clean, **env},
                       capture_output=True, text=True, timeout=60)
    assert p.returncode == 0, p.stderr
    return json.loads([ln for ln in p.stdout.splitlines() if ln.startswith("RESULT ")][-1][7:])


CATCH = """
import warnings
def attempt(**kw):
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        try:
            g = dist.init(**kw)
            return {"size": g.size(), "cached": dist.init() is g, "warnings": [str(w.message) for w in seen]}
        except Exception as exc:
            return {"error": type(exc).__name__, "message": str(exc), "is_value_error": isinstance(exc, ValueError)}
"""


def test_nothing_configured() -> None:
    res = _python(CATCH + "report(strict=attempt(strict=True), loose=attempt())", {})
    strict = res["strict"]
    assert strict["error"] == "SetupError", strict
    assert strict["message"].startswith("Couldn't initialize any backend"), strict
    assert "MLX_RANK and MLX_HOSTFILE" in strict["message"] and "mlx-jupyter launch" in strict["message"], strict
    # without strict: a singleton group, cached like any first group
    assert res["loose"] == {"size": 1, "cached": True, "warnings": []}, res["loose"]


def test_ring_requested_but_missing_names_the_variables() -> None:
    res = _python(CATCH + "report(r=attempt(strict=True, backend='ring'))", {})
    assert res["r"]["error"] == "SetupError" and "MLX_RANK and MLX_HOSTFILE" in res["r"]["message"], res


@pytest.mark.parametrize("case", ["missing", "bad json", "bad address", "rank out of range"])
def test_malformed_hostfile_through_init(case: str, tmp_path) -> None:
    path = tmp_path / "hosts.json"
    rank = "0"
    if case == "bad json":
        path.write_text("[[oops")
    elif case == "bad address":
        path.write_text('[["127.0.0.1"], ["127.0.0.1:5001"]]')
    elif case == "rank out of range":
        path.write_text('[["127.0.0.1:5000"], ["127.0.0.1:5001"]]')
        rank = "5"
    needle = {"missing": "cannot read the hostfile", "bad json": "not valid JSON",
              "bad address": "is not ip:port", "rank out of range": "out of range"}[case]
    res = _python(CATCH + "report(strict=attempt(strict=True), loose=attempt())",
                  {"MLX_RANK": rank, "MLX_HOSTFILE": str(path)})
    # strict or not, a broken hostfile is an error naming the file, never a silent singleton
    for kind in ("strict", "loose"):
        info = res[kind]
        assert info.get("error") == "RankEnvError" and info["is_value_error"], info
        assert str(path) in info["message"] and needle in info["message"], info


def test_backends_say_why_and_how_to_fix_here() -> None:
    from mlx_jupyter import distributed as dist

    rows = {b["name"]: b for b in dist.backends()}
    assert set(rows) == {"ring", "jaccl", "jaccl-ring", "nccl", "mpi"}
    assert rows["ring"]["available"] and rows["ring"]["fix"] == ""
    for name in ("jaccl", "jaccl-ring"):
        b = rows[name]
        if sys.platform == "darwin":
            assert b["available"] or ("RDMA" in b["detail"] and "rdma_ctl enable" in b["fix"]), b
        else:
            assert not b["available"], b
            assert b["detail"] == "JACCL is RDMA over Thunderbolt 5, on macOS 26.2+ only", b
            assert b["fix"] == "on Linux use ring (TCP), nccl (NVIDIA GPUs) or mpi", b
    nccl = rows["nccl"]
    if sys.platform == "darwin":
        assert not nccl["available"] and "Macs have none" in nccl["detail"], nccl
    elif not os.path.exists("/proc/driver/nvidia/version"):
        assert not nccl["available"] and nccl["detail"].startswith("no NVIDIA driver"), nccl
        assert "install the NVIDIA driver" in nccl["fix"], nccl
    mpi = rows["mpi"]
    if mpi["available"]:
        assert mpi["detail"].startswith("MPI library libmpi") and mpi["fix"] == "", mpi
    else:
        assert mpi["detail"].startswith("no MPI library found"), mpi
        assert ("openmpi" in mpi["fix"] or "open-mpi" in mpi["fix"]) and "MLX_MPI_LIBNAME" in mpi["fix"], mpi
    assert dist.is_available("ring") and dist.is_available("mpi") == mpi["available"]
    assert dist.is_available("jaccl") == rows["jaccl"]["available"]


def test_init_naming_another_backend_than_the_worlds_never_returns_the_world() -> None:
    """MLX keeps one group per backend: after init() formed one, init(backend="nccl", strict=True) tries nccl and
    raises where it cannot form (it used to return the cached group of another backend without a word)."""
    code = CATCH + """
world = dist.init()
strict = attempt(strict=True, backend="nccl")
loose = attempt(backend="mpi")
report(strict=strict, loose=loose, same=dist.init() is world,
       other_cached=dist.init(backend="mpi") is dist.init(backend="mpi"), other_is_world=dist.init(backend="mpi") is world)
"""
    res = _python(code, {})
    assert res["strict"]["error"] == "SetupError", res
    assert res["strict"]["message"].startswith("init(backend='nccl', strict=True): the nccl backend is not available here"), res
    assert res["strict"]["message"].endswith("(this process's world, formed by an earlier init(), is a single-rank group)"), res
    assert res["loose"]["size"] == 1 and "init(backend='mpi')" in res["loose"]["warnings"][0], res
    assert res["same"] and res["other_cached"] and not res["other_is_world"], res
