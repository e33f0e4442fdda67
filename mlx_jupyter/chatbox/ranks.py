"""One reply of the chat, run on every rank (the cell a :class:`~mlx_jupyter.chatbox.session.ChatSession`
sends): MLX-LM's ``stream_generate`` with the chat template, rank 0 publishing its text as it comes.

Every rank runs the same generation (tensor parallel: each computes its share of every layer;
pipeline: its layers), samples with the same seed, so all make the same tokens, and checks the
Stop between two tokens (:func:`mlx_jupyter.chatbox.stop.agreed`).
"""

from __future__ import annotations

import time
from typing import Any, Mapping, Optional, Sequence

from mlx_jupyter.chatbox import events, stop

#: seconds rank 0 gathers text before publishing it (a message per token of a fast model is waste;
#: a slow model's tokens each go at once)
PUBLISH_EVERY = 0.03

#: this rank's last reply: id, tokens, how it ended, text (what a test or a curious user reads on the ranks)
LAST: dict[str, Any] = {}


class _Publisher:
    """Rank 0's text to the notebook, gathered for at most :data:`PUBLISH_EVERY` s (a no-op elsewhere)."""

    def __init__(self, active: bool) -> None:
        self.active = active
        self.pending = ""
        self.sent_at = 0.0

    def text(self, text: str, now: float) -> None:
        self.pending += text
        if self.active and self.pending and (self.sent_at == 0.0 or now - self.sent_at >= PUBLISH_EVERY):
            self.flush(now)

    def flush(self, now: float) -> None:
        if self.active and self.pending:
            _publish(events.text_event(self.pending))
            self.sent_at = now
        self.pending = ""

    def end(self, stats: events.Stats) -> None:
        self.flush(time.perf_counter())
        if self.active:
            _publish(events.end_event(stats))


def _publish(event: dict[str, Any]) -> None:
    from IPython.display import publish_display_data

    publish_display_data({events.MIME: event})


def _groups(core_group: Any) -> tuple[Any, Any]:
    """(our core's group or None, MLX's world): the product's own handles on a cluster's rank."""
    import mlx.core as mx

    from mlx_jupyter.cluster.rank.names import NAMES
    from mlx_jupyter.collective.group import CoreGroup

    if core_group is None and isinstance(NAMES.group, CoreGroup) and not NAMES.group_aborted():
        core_group = NAMES.group
    return core_group, NAMES.world if NAMES.world is not None else mx.distributed.init()


def reply(model: Any, tokenizer: Any, messages: Sequence[Mapping[str, str]], settings: Mapping[str, Any],
          reply_id: str, core_group: Optional[Any] = None) -> None:
    """Generate the assistant's reply to ``messages`` (the chat so far, the user's prompt last).

    ``settings``: ``temperature``, ``top_p``, ``max_tokens``, ``seed`` (the same on every rank).
    Rank 0 publishes the text and, at the end, the reply's :class:`~mlx_jupyter.chatbox.events.Stats`.
    """
    import mlx.core as mx
    from mlx_lm.generate import generation_stream, stream_generate
    from mlx_lm.sample_utils import make_sampler

    stop.install()
    core, world = _groups(core_group)
    prompt = tokenizer.apply_chat_template(list(messages), add_generation_prompt=True)
    mx.random.seed(int(settings.get("seed", 0)))
    sampler = make_sampler(float(settings.get("temperature", 0.0)), float(settings.get("top_p", 1.0)))
    publisher = _Publisher(world.rank() == 0)
    text, finish, last, first_token_s = "", "", None, 0.0
    started = time.perf_counter()
    tokens = stream_generate(model, tokenizer, prompt, max_tokens=int(settings.get("max_tokens", 256)),
                             sampler=sampler)
    try:
        for last in tokens:
            now = time.perf_counter()
            if last.generation_tokens == 1 and not first_token_s:
                first_token_s = now - started
            text += last.text
            publisher.text(last.text, now)
            if last.finish_reason is None and stop.agreed(stop.requested(reply_id), core, world, generation_stream):
                finish = "stopped"
                break
    finally:
        tokens.close()  # ends MLX-LM's generation (its queued step completes alike on every rank)
        stop.forget(reply_id)
    finish = finish or (last.finish_reason if last is not None else "stop") or "stop"
    stats = events.Stats(tokens=last.generation_tokens if last is not None else 0, prompt_tokens=len(prompt),
                         first_token_s=first_token_s, prompt_tps=last.prompt_tps if last is not None else 0.0,
                         generation_tps=last.generation_tps if last is not None else 0.0, finish=finish)
    LAST.clear()
    LAST.update(reply=reply_id, tokens=stats.tokens, finish=finish, text=text)
    publisher.end(stats)
