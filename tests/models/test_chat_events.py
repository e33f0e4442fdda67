"""The chat's pure parts: rank 0's events and the line of numbers under a reply."""

from __future__ import annotations

import pytest

from mlx_jupyter.chatbox import events
from mlx_jupyter.chatbox.session import ChatSession


def test_an_end_event_round_trips_and_tells_its_numbers_in_one_line():
    stats = events.Stats(tokens=42, prompt_tokens=18, first_token_s=0.314, prompt_tps=57.9, generation_tps=23.46,
                         finish="stopped")
    content = {"data": {events.MIME: events.end_event(stats), "text/plain": "x"}}
    assert events.Stats.from_event(events.parse(content)["end"]) == stats
    assert stats.line() == "42 tokens · 23.5 tokens/s · first token 0.31 s · prompt 18 tokens at 58 tokens/s · stopped"


def test_other_displays_are_not_chat_events():
    assert events.parse({"data": {"text/plain": "hello"}}) is None
    assert events.parse({"data": {events.MIME: "not a dict"}}) is None
    assert events.parse(content={"data": {events.MIME: events.text_event("hi")}}) == {"text": "hi"}


def test_the_messages_put_the_system_prompt_first_and_the_prompt_last():
    session = ChatSession(cluster=None, system="Be brief.")  # type: ignore[arg-type]
    session.history = [{"role": "user", "content": "a"}, {"role": "assistant", "content": "b"}]
    assert session.messages("c") == [{"role": "system", "content": "Be brief."}, *session.history,
                                     {"role": "user", "content": "c"}]


@pytest.mark.parametrize("name", ["model.x", "1model", "m; import os"])
def test_names_on_the_ranks_must_be_python_names(name):
    with pytest.raises(ValueError, match="not a Python name"):
        ChatSession(cluster=None, model=name)  # type: ignore[arg-type]


class _Tokenizer:
    def apply_chat_template(self, messages, add_generation_prompt=True):
        return [1, 2, 3]


def _tokens_then(stop: BaseException):
    """MLX-LM's stream_generate on one rank: two tokens, then ``stop`` raised where it makes its next call."""
    from types import SimpleNamespace

    def stream_generate(model, tokenizer, prompt, max_tokens, sampler):
        for i, text in enumerate(("Hel", "lo")):
            yield SimpleNamespace(text=text, generation_tokens=i + 1, finish_reason=None, prompt_tps=9.0,
                                  generation_tps=5.0)
        raise stop
    return stream_generate


def test_the_agreed_stop_ends_a_reply_as_stopped_with_its_tokens_and_the_stop_button_stops_the_cell(monkeypatch):
    import importlib

    from mlx_jupyter.chatbox import ranks

    generate = importlib.import_module("mlx_lm.generate")   # the module (mlx_lm.generate is also a function)

    monkeypatch.setattr(ranks, "_publish", lambda event: None)
    monkeypatch.setattr(generate, "stream_generate", _tokens_then(KeyboardInterrupt(
        "stopped at a collective boundary: after MLX call #12 on `world`, the last any rank had made")))
    ranks.reply(None, _Tokenizer(), [{"role": "user", "content": "hi"}], {"max_tokens": 9}, "r1")
    assert ranks.LAST == {"reply": "r1", "tokens": 2, "finish": "stopped", "text": "Hello"}
    monkeypatch.setattr(generate, "stream_generate", _tokens_then(KeyboardInterrupt()))
    with pytest.raises(KeyboardInterrupt):   # the cell's own stop button is not the chat's
        ranks.reply(None, _Tokenizer(), [{"role": "user", "content": "hi"}], {"max_tokens": 9}, "r2")
