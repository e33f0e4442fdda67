"""What rank 0 sends while it replies, and how a reply's numbers are told (pure).

Rank 0 publishes ``display_data`` of :data:`MIME` (no stream buffering on the way, and apart
from whatever the ranks print): ``{"text": ...}`` for new text, then one ``{"end": {...}}`` with
the reply's numbers (:class:`Stats`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping, Optional

MIME = "application/vnd.mlx-jupyter.chat-event+json"

#: how a reply ended: the model's end token, the token limit, the Stop button
FINISH_WORDS = {"stop": "end of reply", "length": "token limit", "stopped": "stopped"}


@dataclass(frozen=True)
class Stats:
    """One reply's numbers, as rank 0 measured them."""

    tokens: int = 0  # generated
    prompt_tokens: int = 0
    first_token_s: float = 0.0  # from the reply's start on the ranks to its first token (the prompt's prefill)
    prompt_tps: float = 0.0
    generation_tps: float = 0.0
    finish: str = ""  # a key of FINISH_WORDS

    @classmethod
    def from_event(cls, end: Mapping[str, Any]) -> "Stats":
        """The numbers of an ``{"end": {...}}`` event (missing ones are 0)."""
        return cls(tokens=int(end.get("tokens", 0)), prompt_tokens=int(end.get("prompt_tokens", 0)),
                   first_token_s=float(end.get("first_token_s", 0.0)), prompt_tps=float(end.get("prompt_tps", 0.0)),
                   generation_tps=float(end.get("generation_tps", 0.0)), finish=str(end.get("finish", "")))

    def line(self) -> str:
        """One line for under the reply: tokens, tokens/s, time to first token, prompt speed, the end."""
        parts = [f"{self.tokens} tokens", f"{self.generation_tps:.1f} tokens/s",
                 f"first token {self.first_token_s:.2f} s",
                 f"prompt {self.prompt_tokens} tokens at {self.prompt_tps:.0f} tokens/s"]
        if self.finish:
            parts.append(FINISH_WORDS.get(self.finish, self.finish))
        return " · ".join(parts)


def text_event(text: str) -> dict[str, Any]:
    return {"text": text}


def end_event(stats: Stats) -> dict[str, Any]:
    return {"end": {"tokens": stats.tokens, "prompt_tokens": stats.prompt_tokens,
                    "first_token_s": stats.first_token_s, "prompt_tps": stats.prompt_tps,
                    "generation_tps": stats.generation_tps, "finish": stats.finish}}


def parse(content: Mapping[str, Any]) -> Optional[dict[str, Any]]:
    """The chat event in a rank's ``display_data`` content, or None when it is another display."""
    event = (content.get("data") or {}).get(MIME)
    return event if isinstance(event, dict) else None
