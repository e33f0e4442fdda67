"""One rank's part of ``lm_throughput.py``: load the model sharded, generate, time it.

As a script (under ``mlx.launch`` or ``mlx-jupyter launch``):
``python benchmarks/lm_rank.py FOLDER [--pipeline] [--max-tokens N] [--repeat R]``; rank 0 prints one
line ``LM_RESULT {json}``. In a cluster's cell: ``measure(model, tokenizer, ...)``.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from typing import Any

#: the prompts: a few hundred tokens each (the prompt's speed needs a prompt of some length)
PROMPTS = [
    ("Distributed inference of a large language model splits its weights over the machines. " * 12)
    + "Tell me more.",
    ("Each rank holds a part of the model, and the ranks talk over the network. " * 12) + "Go on.",
]


def one(model: Any, tokenizer: Any, text: str, max_tokens: int) -> dict[str, float]:
    """One generation of ``text`` (chat template, greedy): prompt tokens/s, tokens/s, time to first token."""
    from mlx_lm import stream_generate

    prompt = tokenizer.apply_chat_template([{"role": "user", "content": text}], add_generation_prompt=True)
    started, first, last = time.perf_counter(), 0.0, None
    for last in stream_generate(model, tokenizer, prompt, max_tokens=max_tokens):
        if not first:
            first = time.perf_counter() - started
    assert last is not None
    return {"prompt_tps": last.prompt_tps, "generation_tps": last.generation_tps, "ttft": first,
            "tokens": last.generation_tokens, "prompt_tokens": len(prompt)}


def measure(model: Any, tokenizer: Any, max_tokens: int = 64, repeat: int = 3) -> dict[str, float]:
    """A warm-up, then every prompt ``repeat`` times; the median of each number."""
    one(model, tokenizer, PROMPTS[0], 8)
    runs = [one(model, tokenizer, p, max_tokens) for _ in range(repeat) for p in PROMPTS]
    return {k: statistics.median(r[k] for r in runs) for k in runs[0]}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("folder")
    ap.add_argument("--pipeline", action="store_true")
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--repeat", type=int, default=3)
    args = ap.parse_args()
    import mlx.core as mx

    from mlx_jupyter.models.sharded import load_sharded

    world = mx.distributed.init()
    model, tokenizer = load_sharded(args.folder, pipeline=args.pipeline, group=world)
    result = measure(model, tokenizer, args.max_tokens, args.repeat)
    if world.rank() == 0:
        print("LM_RESULT " + json.dumps(result), flush=True)


if __name__ == "__main__":
    main()
