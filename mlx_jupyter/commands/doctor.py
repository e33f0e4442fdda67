"""`mlx-jupyter doctor`: which distributed backends can run here, and how to fix the others."""

from __future__ import annotations

import argparse
import json
import platform
import sys


def table(rows: list[dict]) -> str:
    """The backend table as aligned text."""
    from mlx_jupyter.core.mlx_backends import label

    lines = [f"{'backend':<11} {'status':<10} {'machine':<8} {'mlx build':<10} details"]
    for r in rows:
        status = "available" if r["available"] else "missing"
        machine = label(r.get("machine", r["available"]))
        build = label(r.get("mlx"))
        lines.append(f"{r['name']:<11} {status:<10} {machine:<8} {build:<10} {r['detail']}")
        if r["fix"]:
            lines.append(f"{'':<43} fix: {r['fix']}")
    return "\n".join(lines)


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="mlx-jupyter doctor", description=__doc__)
    parser.add_argument("--json", action="store_true", help="print the table as JSON")
    args = parser.parse_args(argv)
    from mlx_jupyter.distributed import backends
    from mlx_jupyter.launch.rank_env import RankEnvError

    try:
        rows = backends()
    except RankEnvError as exc:
        print(f"mlx-jupyter doctor: {exc}", file=sys.stderr)
        return 2
    if args.json:
        print(json.dumps(rows, indent=2))
        return 0
    print(f"mlx_jupyter on {platform.system()} {platform.machine()}, Python {platform.python_version()}")
    try:
        import mlx.core as mx

        print(f"MLX {mx.__version__}")
    except ImportError:
        print("MLX not installed: pip install 'mlx[cpu]' (Linux) or 'mlx' (macOS)")
    print()
    print(table(rows))
    return 0
