"""Distributed inference with MLX-LM: prompt tokens/s, generation tokens/s and time to first token of
the same model and prompts, sharded over local ranks, four ways side by side, with ratios against
the reference (``mlx.launch``).

  .venv/bin/python benchmarks/lm_throughput.py [--ranks 2] [--pipeline] [--layers 8] [--hidden 256]
      [--max-tokens 64] [--repeat 3] [--save benchmarks/results/lm_throughput.txt]

The model is a random Qwen2 written for the run (``mlx_jupyter.models.tiny``). Ways: a script under
``mlx.launch`` and under ``mlx-jupyter launch`` (``lm_rank.py``; also with ``--bind-to none``, which
tells what its CPU binding of local ranks gives), the same measurement in a cell of
a ``Cluster`` (``Cluster.execute``), and the chat box's replies (``ChatSession``: the same generation
plus rank 0's text sent to the notebook; its time to first
token is rank 0's, the notebook's own is shown beside). Each number is the median over the prompts
and repeats, on rank 0.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any, Optional

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))
sys.path.insert(0, str(ROOT))

from allreduce import header, saved_output  # noqa: E402
from lm_rank import PROMPTS  # noqa: E402

PY = sys.executable
RANK_SCRIPT = str(ROOT / "benchmarks" / "lm_rank.py")


def _launched(argv: list[str], timeout: float) -> dict[str, float]:
    """Run a launcher's command line; rank 0's ``LM_RESULT`` line."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH", "")]))}
    done = subprocess.run(argv, capture_output=True, text=True, timeout=timeout, env=env, cwd=ROOT)
    for line in done.stdout.splitlines():
        if "LM_RESULT " in line:
            return dict(json.loads(line.split("LM_RESULT ", 1)[1]))
    raise RuntimeError(f"{argv[0]} gave no result (exit {done.returncode}):\n{done.stdout[-2000:]}\n{done.stderr[-2000:]}")


def in_cluster(folder: Path, ranks: int, pipeline: bool, max_tokens: int, repeat: int) -> tuple[dict, dict]:
    """The measurement in a cell, then the chat box's replies, on one ``Cluster`` of ``ranks``."""
    from mlx_jupyter.chatbox.session import ChatSession, Settings
    from mlx_jupyter.cluster import Cluster

    with Cluster(n=ranks) as cluster:
        cluster.execute(f"import sys\nsys.path.insert(0, {str(ROOT / 'benchmarks')!r})\nimport lm_rank\n"
                        "from mlx_jupyter.models.sharded import load_sharded\n"
                        f"model, tokenizer = load_sharded({str(folder)!r}, pipeline={pipeline})\n"
                        f"_lm = lm_rank.measure(model, tokenizer, {max_tokens}, {repeat})", timeout=600)
        cell = dict(cluster.pull("_lm", targets=[0])[0])
        session = ChatSession(cluster, settings=Settings(max_tokens=max_tokens, seed=0))
        session.prepare()
        rows: list[dict[str, float]] = []
        for i in range(repeat * len(PROMPTS) + 1):
            session.reset()
            reply = session.send(PROMPTS[i % len(PROMPTS)])
            if not reply.wait(300) or reply.error or reply.stats is None:
                raise RuntimeError(f"the chat's reply failed: {reply.error}")
            if i:  # the first is the warm-up
                rows.append({"prompt_tps": reply.stats.prompt_tps, "generation_tps": reply.stats.generation_tps,
                             "ttft": reply.stats.first_token_s, "notebook_ttft": reply.first_text_s or 0.0})
        chat = {k: statistics.median(r[k] for r in rows) for k in rows[0]}
    return cell, chat


def table(results: dict[str, Optional[dict[str, Any]]]) -> None:
    """The rows and their ratios against the first (the reference)."""
    ref = results["mlx.launch"]
    print(f"{'way':<22} | {'prompt tok/s':>12} {'gen tok/s':>10} {'TTFT ms':>8} | {'prompt x':>8} {'gen x':>6} "
          f"{'TTFT x':>6}")
    for name, r in results.items():
        if r is None:
            print(f"{name:<22} | (did not run)")
            continue
        ratios = ("" if ref is None else f"{r['prompt_tps'] / ref['prompt_tps']:8.2f} "
                  f"{r['generation_tps'] / ref['generation_tps']:6.2f} {r['ttft'] / ref['ttft']:6.2f}")
        extra = f"  (the notebook's first text at {r['notebook_ttft'] * 1e3:.0f} ms)" if "notebook_ttft" in r else ""
        print(f"{name:<22} | {r['prompt_tps']:12.0f} {r['generation_tps']:10.1f} {r['ttft'] * 1e3:8.1f} | {ratios}{extra}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--ranks", type=int, default=2)
    ap.add_argument("--pipeline", action="store_true", help="pipeline parallel (default: tensor parallel)")
    ap.add_argument("--layers", type=int, default=8)
    ap.add_argument("--hidden", type=int, default=256)
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--save", metavar="FILE", help="also write the output to FILE")
    args = ap.parse_args()
    import mlx.core as mx

    from mlx_jupyter.models.tiny import write_tiny_model

    with saved_output(args.save), tempfile.TemporaryDirectory() as tmp:
        print("\n".join(header(f"MLX {mx.__version__}")))
        folder = write_tiny_model(Path(tmp) / "model", layers=args.layers, hidden=args.hidden, heads=8, kv_heads=8,
                                  intermediate=4 * args.hidden)
        way = "pipeline" if args.pipeline else "tensor"
        print(f"a random Qwen2 of {args.layers} layers, hidden size {args.hidden}, float32, {way} parallel over "
              f"{args.ranks} local ranks; {args.max_tokens} tokens per reply, prompts of "
              f"~{len(PROMPTS[0].split())} words; medians of {args.repeat * len(PROMPTS)} replies on rank 0\n")
        script = [PY, RANK_SCRIPT, str(folder), "--max-tokens", str(args.max_tokens), "--repeat", str(args.repeat),
                  *(["--pipeline"] if args.pipeline else [])]
        results: dict[str, Optional[dict[str, Any]]] = {}
        results["mlx.launch"] = _launched([str(Path(PY).parent / "mlx.launch"), "-n", str(args.ranks), "--", *script],
                                          900)
        results["mlx-jupyter launch"] = _launched([PY, "-m", "mlx_jupyter", "launch", "-n", str(args.ranks), "--",
                                                   *script], 900)
        # the same without CPU binding: how much of the difference with mlx.launch the binding makes
        results["  --bind-to none"] = _launched([PY, "-m", "mlx_jupyter", "launch", "-n", str(args.ranks),
                                                 "--bind-to", "none", "--", *script], 900)
        results["Cluster cell"], results["chat box"] = in_cluster(folder, args.ranks, args.pipeline, args.max_tokens,
                                                                  args.repeat)
        table(results)


if __name__ == "__main__":
    main()
