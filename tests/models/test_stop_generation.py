"""Issue 42 on the headline job: Stop pressed while a sharded MLX-LM model generates in a cell.

The ranks stop at the same MLX collective (the agreed stop), MLX's `world` and the loaded model stay,
and the next greedy generation equals one process's, token for token: no restart, no reload.
"""

from __future__ import annotations

import random
import threading
import time

import pytest

from needs import require_module

require_module("mlx_lm", "MLX-LM (pip install -e '.[test]')")

from mlx_jupyter.cluster import Cluster  # noqa: E402
from mlx_jupyter.cluster.cells.display import show_run  # noqa: E402
from test_sharded_generation import PROMPT, TOKENS, folder, reference  # noqa: E402,F401  (the same model and reply)

pytestmark = pytest.mark.timeout(240)

#: stops pressed per way of sharding, each at a random moment of the generation
STOPS = 6

LOAD = """
import mlx_lm
from mlx_jupyter.models.sharded import load_sharded
model, tokenizer = load_sharded({folder!r}, pipeline={pipeline})
prompt = tokenizer.apply_chat_template([{{"role": "user", "content": {prompt!r}}}], add_generation_prompt=True)
"""

#: generation without end: only Stop ends it
ENDLESS = """
while True:
    for r in mlx_lm.stream_generate(model, tokenizer, prompt, max_tokens=10_000):
        pass
"""

GREEDY = f"tokens = [r.token for r in mlx_lm.stream_generate(model, tokenizer, prompt, max_tokens={TOKENS})]"


def _world_calls(c: Cluster) -> list[int]:
    return [((s.get("mlx") or {}).get("counts") or {}).get("world", 0) for s in c.where_samples().values()]


@pytest.mark.parametrize("pipeline", [False, True], ids=["tensor", "pipeline"])
def test_stop_during_sharded_generation_keeps_world_and_the_model(folder, reference, pipeline):
    rng = random.Random(5 + pipeline)
    with Cluster(n=2) as c:
        c.execute(LOAD.format(folder=str(folder), pipeline=pipeline, prompt=PROMPT), timeout=120)
        model_ids = c.pull("id(model)")
        for i in range(STOPS):
            r = c.run(ENDLESS)
            deadline = time.monotonic() + 60
            made = rng.choice([3, 12, 40, 80])   # in the prompt's prefill (8 all_sums), or in later tokens
            while min(_world_calls(c) or [0]) < made or len(_world_calls(c)) < 2:
                assert time.monotonic() < deadline and not r.done.is_set(), (i, _world_calls(c))
            threading.Event().wait(rng.uniform(0, 0.2))   # a random moment of the generation, not a synchronisation
            r.interrupt()
            assert r.wait(10), i
            assert all(o.status == "released" for o in r.outcomes.values()), \
                (i, {k: (o.status, o.note[:200]) for k, o in r.outcomes.items()}, c.drainer.last)
            assert all(not row.get("world_closed") for row in c.status()), (i, c.status(), c.drainer.last)
            c.drainer.thread.join(10)
            show_run(c.run(GREEDY), timeout=60)
            assert c.pull("tokens") == [reference] * 2, (i, c.drainer.last)
        assert c.pull("id(model)") == model_ids   # the same loaded model: nothing reloaded
