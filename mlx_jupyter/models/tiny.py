"""A tiny random language model written as an MLX-LM model folder, made offline in a second.

``write_tiny_model(folder)`` writes ``config.json``, the weights as safetensors (split in files
listed by ``model.safetensors.index.json``, which MLX-LM's pipeline loading reads to find each
rank's layers) and a byte-level BPE tokenizer with a chat template (:mod:`.tokenizer`), so that
``mlx_lm.load(folder)`` and ``mlx_lm.sharded_load(folder, ...)`` load it as a real checkpoint.
Its answers are noise; its shape, loading, sharding and generation are those of a real model.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Union

from mlx_jupyter.models.tokenizer import eos_id, write_tokenizer

#: the architecture: Qwen2 (Llama's layers with biased q/k/v), which MLX-LM can shard both ways
#: (``Model.shard`` for tensor parallel; its ``PipelineMixin`` for pipeline parallel, which Llama lacks)
MODEL_TYPE = "qwen2"


def tiny_config(vocab_size: int, eos: int, layers: int = 4, hidden: int = 64, heads: int = 4,
                kv_heads: int = 4, intermediate: int = 128) -> dict[str, Any]:
    """The ``config.json`` of a tiny Qwen2 (``heads`` and ``kv_heads`` divisible by the ranks that
    shard it in tensor parallel; at least as many ``layers`` as pipeline stages)."""
    if hidden % heads or heads % kv_heads:
        raise ValueError(f"hidden ({hidden}) must divide by heads ({heads}), heads by kv_heads ({kv_heads})")
    return {
        "model_type": MODEL_TYPE, "architectures": ["Qwen2ForCausalLM"],
        "hidden_size": hidden, "num_hidden_layers": layers, "intermediate_size": intermediate,
        "num_attention_heads": heads, "num_key_value_heads": kv_heads, "rms_norm_eps": 1e-6,
        "vocab_size": vocab_size, "max_position_embeddings": 32768, "rope_theta": 10000.0,
        "tie_word_embeddings": False, "torch_dtype": "float32", "eos_token_id": eos,
    }


def random_weights(config: dict[str, Any], seed: int) -> dict[str, Any]:
    """Named float32 weights for ``config``, drawn from ``seed`` alone (the process's MLX random
    state is left as it was): norms 1, weights normal scaled by their fan-in, small biases.
    The output head is not tied to the embeddings: a tied random model only repeats its last token."""
    import mlx.core as mx
    from mlx.utils import tree_flatten
    from mlx_lm.models.qwen2 import Model, ModelArgs

    args = ModelArgs.from_dict(config)  # type: ignore[no-untyped-call]  # mlx-lm's, untyped
    flat: list[tuple[str, Any]] = tree_flatten(Model(args).parameters())  # type: ignore[assignment]  # MLX's union
    shapes = {name: p.shape for name, p in flat}
    keys = mx.random.split(mx.random.key(seed), len(shapes))
    out = {}
    for i, name in enumerate(sorted(shapes)):
        shape = shapes[name]
        if name.endswith("norm.weight"):
            out[name] = mx.ones(shape, dtype=mx.float32)
        elif name.endswith(".bias"):
            out[name] = 0.02 * mx.random.normal(shape, key=keys[i])
        elif name.endswith("embed_tokens.weight"):
            out[name] = mx.random.normal(shape, key=keys[i])  # as nn.Embedding's scale; the head is untied
        else:
            out[name] = mx.random.normal(shape, key=keys[i]) * (shape[-1] ** -0.5)
    mx.eval(out)
    return out


def _file_of(name: str, layers: int, files: int) -> int:
    """Which of ``files`` weight files holds ``name``: the layers in equal runs, the rest in the first."""
    parts = name.split(".")
    if "layers" not in parts:
        return 0
    layer = int(parts[parts.index("layers") + 1])
    return min(files - 1, layer * files // layers)


def write_tiny_model(folder: Union[str, Path], *, layers: int = 4, hidden: int = 64, heads: int = 4,
                     kv_heads: int = 4, intermediate: int = 128, vocab_size: int = 384, seed: int = 0,
                     files: int = 2) -> Path:
    """Write a random tiny Qwen2 as an MLX-LM model folder at ``folder`` (made if missing); return it.

    ``files``: how many safetensors files the weights are split into (by layer, with
    ``model.safetensors.index.json``). The same arguments write the same model.
    """
    import mlx.core as mx

    path = Path(folder)
    if files < 1 or files > layers:
        raise ValueError(f"files must be 1..layers ({layers}), not {files}")
    path.mkdir(parents=True, exist_ok=True)
    size = write_tokenizer(path, vocab_size)
    config = tiny_config(size, eos_id(path), layers, hidden, heads, kv_heads, intermediate)
    (path / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    weights = random_weights(config, seed)
    names = [f"model-{i + 1:05d}-of-{files:05d}.safetensors" for i in range(files)]
    groups: list[dict[str, Any]] = [{} for _ in names]
    for name, value in weights.items():
        groups[_file_of(name, layers, files)][name] = value
    for file_name, group in zip(names, groups):
        mx.save_safetensors(str(path / file_name), group, metadata={"format": "mlx"})
    index = {"metadata": {"total_size": sum(int(v.nbytes) for v in weights.values())},
             "weight_map": {name: names[_file_of(name, layers, files)] for name in sorted(weights)}}
    (path / "model.safetensors.index.json").write_text(json.dumps(index, indent=2) + "\n")
    return path
