"""One reply of the chat, run on every rank (the cell a :class:`~mlx_jupyter.chatbox.session.ChatSession`
sends): MLX-LM's ``stream_generate`` with the chat template, rank 0 publishing its text as it comes.

Every rank runs the same generation (tensor parallel: each computes its share of every layer;
pipeline: its layers) and samples with the same seed, so all make the same tokens. The Stop is the
cluster's agreed stop (``cluster.stop_at_boundary``): every rank stops before the same MLX collective,
so all have yielded the same tokens, and the reply ends there as a stopped one.
"""

from __future__ import annotations

import time
from typing import Any, Mapping, Sequence

from mlx_jupyter.chatbox import events

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

    publish_display_data({events.MIME: event})  # type: ignore[no-untyped-call]  # IPython's, untyped


#: how the agreed stop's KeyboardInterrupt begins (mlx_jupyter.where.mlx_calls.Record.stop_here)
AGREED_STOP = "stopped at a collective boundary"


def reply(model: Any, tokenizer: Any, messages: Sequence[Mapping[str, str]], settings: Mapping[str, Any],
          reply_id: str) -> None:
    """Generate the assistant's reply to ``messages`` (the chat so far, the user's prompt last).

    ``settings``: ``temperature``, ``top_p``, ``max_tokens``, ``seed`` (the same on every rank).
    Rank 0 publishes the text and, at the end, the reply's :class:`~mlx_jupyter.chatbox.events.Stats`.
    """
    import mlx.core as mx
    from mlx_lm.generate import stream_generate
    from mlx_lm.sample_utils import make_sampler

    world = mx.distributed.init()
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
    except KeyboardInterrupt as stopped:
        if not str(stopped).startswith(AGREED_STOP):   # the cell's own stop button: the cell stops
            raise
        finish = "stopped"   # every rank stopped before the same call: the same tokens yielded everywhere
    finally:
        tokens.close()  # ends MLX-LM's generation (what it queued was made alike on every rank)
    finish = finish or (last.finish_reason if last is not None else "stop") or "stop"
    stats = events.Stats(tokens=last.generation_tokens if last is not None else 0, prompt_tokens=len(prompt),
                         first_token_s=first_token_s, prompt_tps=last.prompt_tps if last is not None else 0.0,
                         generation_tps=last.generation_tps if last is not None else 0.0, finish=finish)
    LAST.clear()
    LAST.update(reply=reply_id, tokens=stats.tokens, finish=finish, text=text)
    publisher.end(stats)
