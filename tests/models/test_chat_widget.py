"""``mlx_jupyter.chat(...)`` in a real kernel with 2 ranks: the box's replies are MLX-LM's own
generation (greedy, with the chat history, sampled with a seed), Stop ends a reply at the same
token on every rank and the model stays loaded, Reset forgets the chat."""

from __future__ import annotations

import json

import pytest

from needs import require_module

require_module("mlx_lm", "MLX-LM (pip install -e '.[test]')")

from mlx_jupyter.chatbox.widget import bubble  # noqa: E402
from mlx_jupyter.models.tiny import write_tiny_model  # noqa: E402
from tests.cluster.kernel import cluster_kernel  # noqa: E402

pytestmark = pytest.mark.timeout(150)


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    return write_tiny_model(tmp_path_factory.mktemp("lm") / "tiny", seed=7)


@pytest.fixture(scope="module")
def generate(folder):
    """One process's generation: ``generate(messages, max_tokens, temperature=0, top_p=1, seed=0)``."""
    import mlx.core as mx
    import mlx_lm
    from mlx_lm.sample_utils import make_sampler

    model, tokenizer = mlx_lm.load(str(folder))

    def run(messages, max_tokens, temperature=0.0, top_p=1.0, seed=0):
        prompt = tokenizer.apply_chat_template(messages, add_generation_prompt=True)
        mx.random.seed(seed)
        return "".join(r.text for r in mlx_lm.stream_generate(model, tokenizer, prompt, max_tokens=max_tokens,
                                                              sampler=make_sampler(temperature, top_p)))
    return run


@pytest.fixture(scope="module")
def kernel(folder):
    for k in cluster_kernel(2, stop=True):
        res = k.run(f"import json, mlx_jupyter\nbox = mlx_jupyter.chat(path={str(folder)!r}, max_tokens=16)\nbox", 120)
        assert res.status == "ok", res.traceback
        yield k


def ask(k, prompt: str, timeout: float = 60) -> dict:
    """Send ``prompt`` through the box, wait for the reply's end; what the box shows of it."""
    res = k.run(f"r = box.send({prompt!r})\nassert box.wait({timeout})\n"
                "print(json.dumps({'text': box.last_reply, 'error': r.error, 'stats': box._stats_html.value, "
                "'shown': box._reply_html.value, 'finish': r.stats.finish if r.stats else None}))", timeout + 10)
    assert res.status == "ok", res.traceback
    return json.loads(res.stdout.strip().splitlines()[-1])


def test_a_reply_is_the_greedy_generation_shown_with_its_numbers(kernel, generate):
    kernel.run("box.reset()")
    shown = ask(kernel, "Hello there!")
    assert shown["error"] == "" and shown["text"] == generate([{"role": "user", "content": "Hello there!"}], 16)
    assert shown["finish"] == "length" and "16 tokens" in shown["stats"] and "tokens/s" in shown["stats"]
    assert "first token" in shown["stats"] and "token limit" in shown["stats"]
    assert shown["shown"] == bubble("assistant", shown["text"])  # the transcript shows the reply, escaped


def test_the_next_prompt_is_answered_with_the_chat_so_far(kernel, generate):
    kernel.run("box.reset()")
    first = ask(kernel, "Hi")["text"]
    second = ask(kernel, "And then?")["text"]
    history = [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": first},
               {"role": "user", "content": "And then?"}]
    assert second == generate(history, 16)
    kernel.run("box.reset()")
    assert ask(kernel, "And then?")["text"] == generate([{"role": "user", "content": "And then?"}], 16)


def test_sampling_settings_reach_every_rank(kernel, generate):
    kernel.run("box.reset()\nbox.temperature.value = 0.9\nbox.top_p.value = 0.8\nbox.session.settings.seed = 11")
    try:
        shown = ask(kernel, "Surprise me")
    finally:
        kernel.run("box.temperature.value = 0.0\nbox.top_p.value = 1.0\nbox.session.settings.seed = None")
    expected = generate([{"role": "user", "content": "Surprise me"}], 16, temperature=0.9, top_p=0.8, seed=11)
    assert shown["text"] == expected
    assert expected != generate([{"role": "user", "content": "Surprise me"}], 16)  # the settings mattered
    res = kernel.run("%%mlx_distributed\nfrom mlx_jupyter.chatbox.ranks import LAST\nprint(repr(LAST['text']))")
    assert f"[ranks 0-1] {expected!r}" in res.stdout, res.stdout  # every rank sampled the same tokens


def test_stop_ends_the_reply_at_the_same_token_everywhere_and_the_model_stays(kernel, generate):
    kernel.run("box.reset()\nbox.max_tokens.value = 20000")
    res = kernel.run("r = box.send('Tell me a long story')\nassert r.wait_for_text(10, 30)\nbox.stop_button.click()\n"
                     "assert box.wait(30)\nprint(r.stats.finish, r.stats.tokens, box.send_button.disabled, "
                     "box.stop_button.disabled)", 60)
    assert res.status == "ok", res.traceback
    finish, tokens, send_disabled, stop_disabled = res.stdout.split()
    assert finish == "stopped" and 0 < int(tokens) < 20000 and (send_disabled, stop_disabled) == ("False", "True")
    res = kernel.run("%%mlx_distributed\nfrom mlx_jupyter.chatbox.ranks import LAST\n"
                     "print(LAST['tokens'], LAST['finish'], mx.distributed.all_sum(mx.array(1.0), group=world).item())")
    assert f"[ranks 0-1] {tokens} stopped 2.0" in res.stdout, res.stdout
    kernel.run("box.max_tokens.value = 16\nbox.reset()")
    assert ask(kernel, "Hello there!")["text"] == generate([{"role": "user", "content": "Hello there!"}], 16)


def test_a_pipeline_parallel_chat_stops_alike_and_answers_again(kernel, folder, generate):
    res = kernel.run(f"pbox = mlx_jupyter.chat(path={str(folder)!r}, pipeline=True, model='pmodel', tokenizer='ptok', "
                     "max_tokens=20000)\nr = pbox.send('Tell me a long story')\nassert r.wait_for_text(10, 30)\n"
                     "pbox.stop()\nassert pbox.wait(30)\nprint(r.stats.finish)\npbox.max_tokens.value = 16\npbox.reset()\n"
                     "pbox.send('Hello there!')\nassert pbox.wait(60)\nprint(json.dumps(pbox.last_reply))", 150)
    assert res.status == "ok", res.traceback
    finish, text = res.stdout.strip().splitlines()[-2:]
    assert finish == "stopped" and json.loads(text) == generate([{"role": "user", "content": "Hello there!"}], 16)
    res = kernel.run("%%mlx_distributed\nprint(pmodel.model.start_idx, pmodel.model.end_idx)")
    assert "[rank 0] 2 4" in res.stdout and "[rank 1] 0 2" in res.stdout, res.stdout
