"""`mlx-jupyter doctor`: which distributed backends can run here, and how to fix the others."""

from __future__ import annotations

import argparse
import json
import platform
import sys
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from mlx_jupyter.vocab.rank_env import RankEnv


def table(rows: list[dict[str, Any]]) -> str:
    """The backend table as aligned text."""
    from mlx_jupyter.collective.mlx_backends import label

    lines = [f"{'backend':<11} {'status':<10} {'machine':<8} {'mlx build':<10} details"]
    for r in rows:
        status = "available" if r["available"] else "missing"
        machine = label(r.get("machine", r["available"]))
        build = label(r.get("mlx"))
        lines.append(f"{r['name']:<11} {status:<10} {machine:<8} {build:<10} {r['detail']}")
        if r["fix"]:
            lines.append(f"{'':<43} fix: {r['fix']}")
    return "\n".join(lines)


def launch_notes(env: RankEnv) -> dict[str, str]:
    """Per backend, what this process's environment launches (JACCL with or without a coordinator)."""
    notes = {}
    if env.mlx_hostfile and env.rank is not None:
        notes["ring"] = f"launched: rank {env.rank}, MLX_HOSTFILE={env.mlx_hostfile}"
    j = env.jaccl
    if j.configured:
        where = f"rank {env.rank if env.rank is not None else 0}, devices {j.devices_var or 'none'}" + \
                (f"={j.devices}" if j.devices else "")
        if j.coordinator:
            notes["jaccl"] = f"launched: {where}, coordinator {j.coordinator_var}={j.coordinator}"
        elif env.hostfile:
            notes["jaccl"] = (f"launched without a coordinator: {where}; the bootstrap runs over mlx-jupyter's "
                              f"signed ring ({env.hostfile_var}={env.hostfile})")
        else:
            notes["jaccl"] = (f"launched without a coordinator: {where}; mx.distributed.init(backend='jaccl') "
                              "needs all_gather_factory=mlx_jupyter.distributed.all_gather_factory() over a ring "
                              "of ours, or MLX_JACCL_COORDINATOR")
        notes["jaccl-ring" if j.ring else "jaccl"] = notes.pop("jaccl")
    if "nccl" in env.launchers:
        notes["nccl"] = "launched: MLX_WORLD_SIZE and NCCL_HOST_IP set"
    if "mpi" in env.launchers:
        notes["mpi"] = "launched by mpirun"
    return notes


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="mlx-jupyter doctor", description=__doc__)
    parser.add_argument("--json", action="store_true", help="print the table as JSON")
    args = parser.parse_args(argv)
    from mlx_jupyter.distributed import backends
    from mlx_jupyter.vocab.rank_env import RankEnvError, current

    try:
        rows = backends()
        notes = launch_notes(current())
    except RankEnvError as exc:
        print(f"mlx-jupyter doctor: {exc}", file=sys.stderr)
        return 2
    for row in rows:
        row["launch"] = notes.get(row["name"], "")
    if args.json:
        print(json.dumps(rows, indent=2))
        return 0
    print(f"mlx_jupyter on {platform.system()} {platform.machine()}, Python {platform.python_version()}")
    try:
        import mlx.core as mx

        print(f"MLX {getattr(mx, '__version__')}")  # (not in MLX's stubs)
    except ImportError:
        print("MLX not installed: pip install 'mlx[cpu]' (Linux) or 'mlx' (macOS)")
    print()
    print(table(rows))
    print()
    print("this process's launch environment:" if notes else "this process's launch environment: none "
          "(not started as a rank)")
    for name, note in notes.items():
        print(f"  {name}: {note}")
    return 0
