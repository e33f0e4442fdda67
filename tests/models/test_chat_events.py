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
