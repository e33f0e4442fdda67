"""Loading an MLX-LM model sharded over the ranks, run on every rank (a ``%%mlx_distributed`` cell).

Tensor parallel is what ``mlx_lm generate/chat --shard`` does (``model.shard(group)``: every
layer split over the ranks, which all compute every token); pipeline parallel gives each rank a
run of layers (``model.model.pipeline(group)``), and reads only the weight files those need.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Optional, Union


def load_sharded(path: Union[str, Path], pipeline: bool = False, group: Optional[Any] = None) -> tuple[Any, Any]:
    """``(model, tokenizer)`` of the MLX-LM model folder ``path``, this rank's shard of it over
    ``group`` (default MLX's world): tensor parallel, or ``pipeline`` parallel. On one rank, the whole model."""
    import mlx.core as mx
    from mlx_lm.utils import load, sharded_load

    from mlx_jupyter.models.shard_recipe import attach, recipe_of

    group = group if group is not None else mx.distributed.init()
    if group.size() == 1:
        model, tokenizer = load(str(path))[:2]
        return model, tokenizer
    if pipeline:
        model, tokenizer = sharded_load(str(path), pipeline_group=group)[:2]
    else:
        model, tokenizer = sharded_load(str(path), tensor_group=group)[:2]
    if recipe_of(model) is None:   # on a cluster's rank, sharded_load gave it already
        attach(model, path, group, tensor=not pipeline, pipeline=pipeline)
    return model, tokenizer


def layer_share(model: Any) -> tuple[int, int]:
    """``(first, end)``: the layers this rank computes (all of them unless pipeline parallel)."""
    inner = getattr(model, "model", model)
    end = getattr(inner, "end_idx", None)
    return int(getattr(inner, "start_idx", 0)), int(end if end is not None else len(inner.layers))
