"""The chat's session on 4 ranks, from plain Python (tensor parallel: a head per rank): a reply is
one process's greedy generation, and Stop ends a reply at the same token on all four."""

from __future__ import annotations

import pytest

from needs import require_module

require_module("mlx_lm", "MLX-LM (pip install -e '.[test]')")

from mlx_jupyter.chatbox.session import ChatSession, Settings  # noqa: E402
from mlx_jupyter.cluster import Cluster  # noqa: E402
from mlx_jupyter.models.tiny import write_tiny_model  # noqa: E402

pytestmark = pytest.mark.timeout(150)


def test_four_ranks_reply_greedily_and_stop_together(tmp_path, descendants):
    import mlx_lm

    folder = write_tiny_model(tmp_path / "tiny", seed=2)
    model, tokenizer = mlx_lm.load(str(folder))
    prompt = tokenizer.apply_chat_template([{"role": "user", "content": "Hi"}], add_generation_prompt=True)
    expected = mlx_lm.generate(model, tokenizer, prompt, max_tokens=12)
    before = descendants()
    with Cluster(n=4) as cluster:
        session = ChatSession(cluster, settings=Settings(max_tokens=12))
        session.load(str(folder), timeout=90)
        session.prepare()
        reply = session.send("Hi")
        assert reply.wait(60) and reply.error == "" and reply.text == expected
        session.reset()
        session.settings.max_tokens = 20000
        reply = session.send("Tell me a long story")
        assert reply.wait_for_text(10, 30) and session.stop() and reply.wait(30)
        assert reply.error == "" and reply.stats is not None and reply.stats.finish == "stopped"
        counts = cluster.execute("from mlx_jupyter.chatbox.ranks import LAST\n(LAST['tokens'], LAST['finish'])")
        assert counts == [repr((reply.stats.tokens, "stopped"))] * 4
        assert reply.stats.tokens < 20000
    assert not [p for p in descendants() - before if __import__("psutil").pid_exists(p)]
