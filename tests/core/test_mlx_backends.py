"""backends()/is_available(): the machine probe and the installed MLX build, both columns."""

from __future__ import annotations

import types

import pytest

mx = pytest.importorskip("mlx.core")

import mlx_jupyter.distributed as dist  # noqa: E402
from mlx_jupyter.collective import mlx_backends  # noqa: E402
from mlx_jupyter.commands import doctor  # noqa: E402


def rows() -> dict[str, dict]:
    return {r["name"]: r for r in dist.backends()}


def test_real_mlx_column() -> None:
    r = rows()
    assert r["ring"]["mlx"] is True and r["ring"]["machine"] is True and dist.is_available("ring")
    for name in ("nccl", "jaccl"):  # CPU-only MLX on Linux: neither
        assert r[name]["mlx"] is mx.distributed.is_available(name) is False
        assert not dist.is_available(name)
    for row in r.values():
        assert row["available"] == (row["machine"] and row["mlx"] is not False)


def test_machine_has_it_but_mlx_build_does_not(monkeypatch: pytest.MonkeyPatch) -> None:
    """NCCL installed on the machine, but the MLX build lacks it: missing, with the pip fix."""
    monkeypatch.setattr(dist._core, "backends", lambda mpi_libname="": [
        {"name": "nccl", "available": True, "detail": "NCCL libnccl.so.2, driver 580", "fix": ""}])
    monkeypatch.setattr(mlx_backends, "mlx_build", lambda name: False)
    [row] = dist.backends()
    assert row["machine"] and row["mlx"] is False and not row["available"]
    assert not dist.is_available("nccl")
    text = doctor.table([row])
    assert "this MLX build has no nccl" in text and "pip install 'mlx[cuda12]'" in text
    assert text.splitlines()[1].split()[:4] == ["nccl", "missing", "yes", "no"]


def test_mlx_without_per_backend_query_is_unknown(monkeypatch: pytest.MonkeyPatch) -> None:
    old = types.SimpleNamespace(distributed=types.SimpleNamespace(is_available=lambda: True))
    monkeypatch.setattr(mlx_backends, "_mlx_core", lambda: old)
    assert mlx_backends.mlx_build("ring") is None
    r = rows()
    assert r["ring"]["mlx"] is None and r["ring"]["available"] is True  # unknown keeps the machine answer
    text = doctor.table(list(r.values()))
    ring = next(line for line in text.splitlines() if line.startswith("ring"))
    assert ring.split()[:4] == ["ring", "available", "yes", "unknown"]


def test_doctor_prints_both_columns(capsys: pytest.CaptureFixture[str]) -> None:
    assert doctor.main([]) == 0
    out = capsys.readouterr().out
    assert "machine" in out and "mlx build" in out
    ring = next(line for line in out.splitlines() if line.startswith("ring"))
    assert ring.split()[:4] == ["ring", "available", "yes", "yes"]
