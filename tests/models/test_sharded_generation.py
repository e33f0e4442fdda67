"""MLX-LM's two ways of sharding on a cluster of 2 and of 4 local ranks: tensor parallel (as
``mlx_lm generate --shard``) and pipeline parallel, each token for token one process's greedy output."""

from __future__ import annotations

import pytest

from needs import require_module

require_module("mlx_lm", "MLX-LM (pip install -e '.[test]')")

from mlx_jupyter.cluster import Cluster  # noqa: E402
from mlx_jupyter.models.tiny import write_tiny_model  # noqa: E402

pytestmark = pytest.mark.timeout(180)

PROMPT = "Tell me about the ranks."
TOKENS = 24


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    return write_tiny_model(tmp_path_factory.mktemp("lm") / "tiny", layers=4, heads=4, kv_heads=4)


@pytest.fixture(scope="module")
def reference(folder):
    """One process's greedy tokens for :data:`PROMPT`."""
    import mlx_lm

    model, tokenizer = mlx_lm.load(str(folder))
    prompt = tokenizer.apply_chat_template([{"role": "user", "content": PROMPT}], add_generation_prompt=True)
    return [r.token for r in mlx_lm.stream_generate(model, tokenizer, prompt, max_tokens=TOKENS)]


@pytest.fixture(scope="module", params=[2, 4])
def cluster(request, descendants):
    before = descendants()
    c = Cluster(n=request.param).start(timeout=60)
    try:
        yield c
    finally:
        c.stop()
    assert not [p for p in descendants() - before if __import__("psutil").pid_exists(p)]


GENERATE = """
from mlx_jupyter.models.sharded import load_sharded, layer_share
import mlx_lm
model, tokenizer = load_sharded({folder!r}, pipeline={pipeline})
prompt = tokenizer.apply_chat_template([{{"role": "user", "content": {prompt!r}}}], add_generation_prompt=True)
tokens = [r.token for r in mlx_lm.stream_generate(model, tokenizer, prompt, max_tokens={tokens})]
share = layer_share(model)
heads = model.model.layers[share[0]].self_attn.n_heads
"""


@pytest.mark.parametrize("pipeline", [False, True], ids=["tensor", "pipeline"])
def test_sharded_greedy_generation_equals_one_process(cluster, folder, reference, pipeline):
    cluster.execute(GENERATE.format(folder=str(folder), pipeline=pipeline, prompt=PROMPT, tokens=TOKENS), timeout=120)
    n = cluster.size
    assert cluster.pull("tokens") == [reference] * n
    shares, heads = cluster.pull("share"), cluster.pull("heads")
    if pipeline:  # each rank its run of layers, the last ones on rank 0 (MLX-LM's order)
        per = 4 // n
        assert shares == [(4 - per * (r + 1), 4 - per * r) for r in range(n)]
        assert heads == [4] * n
    else:  # every rank every layer, with its share of the heads
        assert shares == [(0, 4)] * n and heads == [4 // n] * n
