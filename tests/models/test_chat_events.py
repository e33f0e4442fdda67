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


def test_a_stop_request_on_the_control_channel_is_noted_and_answered():
    from mlx_jupyter.chatbox import stop

    sent = []

    class Session:
        def send(self, stream, msg_type, content, parent, ident):
            sent.append((msg_type, content))

    class Kernel:
        control_handlers: dict = {}
        session = Session()

    kernel = Kernel()
    assert stop.install(kernel)
    kernel.control_handlers[stop.MSG_TYPE]("stream", [b"id"], {"content": {"reply": "r1"}})
    assert stop.requested("r1") and not stop.requested("r2")
    assert sent == [("mlx_chat_stop_reply", {"status": "ok", "reply": "r1"})]
    stop.forget("r1")
    assert not stop.requested("r1")


def test_the_agreed_stop_on_one_rank_is_its_own_wish():
    import mlx.core as mx

    from mlx_jupyter.chatbox import stop

    world = mx.distributed.init()
    assert world.size() == 1
    assert stop.agreed(True, None, world) and not stop.agreed(False, None, world)
