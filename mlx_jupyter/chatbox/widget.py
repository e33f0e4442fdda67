"""``mlx_jupyter.chat(...)``: a chat box (ipywidgets) over a model sharded on a cluster's ranks.

Each prompt runs MLX-LM's ``stream_generate`` on every rank with the chat so far and the model's
chat template (:class:`~mlx_jupyter.chatbox.session.ChatSession`); rank 0's text appears as it is
made, its numbers under it (tokens/s, time to first token); Stop ends the reply after the same
token on every rank, and the model stays loaded; Reset forgets the chat.
"""

from __future__ import annotations

import html
from typing import Any, Optional

import ipywidgets as widgets

from mlx_jupyter.chatbox.session import ChatSession, Reply, Settings

_BUBBLE = ("<div style='white-space:pre-wrap;padding:4px 8px;margin:2px 0;border-radius:6px;"
           "background:{bg}'><b>{who}</b> {text}</div>")
_COLORS = {"user": "var(--jp-layout-color2, #eee)", "assistant": "var(--jp-layout-color1, #fff)"}


def bubble(who: str, text: str) -> str:
    """One message of the transcript as HTML (its text escaped)."""
    return _BUBBLE.format(bg=_COLORS.get(who, _COLORS["assistant"]), who=html.escape(who), text=html.escape(text))


def note(text: str, error: bool = False) -> str:
    """A small line under a reply: its numbers, or an error."""
    color = "var(--jp-error-color1, #c00)" if error else "var(--jp-ui-font-color2, #666)"
    return f"<div style='font-size:85%;color:{color};white-space:pre-wrap'>{html.escape(text)}</div>"


class ChatBox(widgets.VBox):  # type: ignore[misc]  # ipywidgets ships no types: its base is Any
    """The chat's widgets over ``session``: transcript, prompt, Send/Stop/Reset, sampling settings."""

    def __init__(self, session: ChatSession, **kwargs: Any) -> None:
        self.session = session
        s = session.settings
        self.transcript = widgets.VBox([], layout=widgets.Layout(max_height="420px", overflow="auto"))
        self.prompt = widgets.Textarea(placeholder="Message the model", layout=widgets.Layout(width="100%"))
        self.send_button = widgets.Button(description="Send", button_style="primary", icon="paper-plane")
        self.stop_button = widgets.Button(description="Stop", button_style="danger", icon="stop", disabled=True)
        self.reset_button = widgets.Button(description="Reset", icon="trash")
        self.temperature = widgets.FloatSlider(value=s.temperature, min=0.0, max=2.0, step=0.05,
                                               description="temperature")
        self.top_p = widgets.FloatSlider(value=s.top_p, min=0.0, max=1.0, step=0.01, description="top p")
        self.max_tokens = widgets.BoundedIntText(value=s.max_tokens, min=1, max=1_000_000, description="max tokens")
        self.status = widgets.HTML("")
        self.send_button.on_click(lambda _: self.send())
        self.stop_button.on_click(lambda _: self.stop())
        self.reset_button.on_click(lambda _: self.reset())
        self._reply_html: Optional[widgets.HTML] = None
        self._stats_html: Optional[widgets.HTML] = None
        buttons = widgets.HBox([self.send_button, self.stop_button, self.reset_button])
        settings = widgets.HBox([self.temperature, self.top_p, self.max_tokens])
        super().__init__([self.transcript, self.prompt, buttons, settings, self.status], **kwargs)

    def settings(self) -> Settings:
        """The sampling settings the widgets show now."""
        return Settings(temperature=float(self.temperature.value), top_p=float(self.top_p.value),
                        max_tokens=int(self.max_tokens.value), seed=self.session.settings.seed)

    def send(self, prompt: Optional[str] = None) -> Optional[Reply]:
        """Send ``prompt`` (default: the prompt box's text) and show the reply as it comes; returns at once."""
        text = self.prompt.value if prompt is None else prompt
        if not text.strip() or self.session.busy:
            return None
        self.session.settings = self.settings()
        self._reply_html, self._stats_html = widgets.HTML(bubble("assistant", "")), widgets.HTML("")
        try:
            reply = self.session.send(text, on_update=self._update)
        except Exception as e:
            self.status.value = note(f"{type(e).__name__}: {e}", error=True)
            return None
        if prompt is None:
            self.prompt.value = ""
        self.transcript.children = (*self.transcript.children, widgets.HTML(bubble("user", text)),
                                    self._reply_html, self._stats_html)
        self.status.value = ""
        self.send_button.disabled, self.stop_button.disabled, self.reset_button.disabled = True, False, True
        return reply

    def _update(self, reply: Reply) -> None:
        """A piece of ``reply`` came, or it ended (the reply's thread)."""
        if self._reply_html is not None:
            self._reply_html.value = bubble("assistant", reply.text)
        if not reply.over:
            return
        if self._stats_html is not None:
            if reply.error:
                self._stats_html.value = note(reply.error, error=True)
            elif reply.stats is not None:
                self._stats_html.value = note(reply.stats.line())
        self.send_button.disabled, self.stop_button.disabled, self.reset_button.disabled = False, True, False

    def stop(self) -> bool:
        """End the reply being made after the same token on every rank (the model stays loaded)."""
        try:
            return self.session.stop()
        except Exception as e:  # e.g. the controller is gone: the control channel cannot carry the stop
            self.status.value = note(f"the stop did not reach the ranks: {type(e).__name__}: {e}", error=True)
            return False

    def reset(self) -> None:
        """Forget the chat (the model stays loaded)."""
        if self.session.busy:
            self.status.value = note("a reply is still being made: stop it first", error=True)
            return
        self.session.reset()
        self.transcript.children = ()
        self.status.value = ""

    def wait(self, timeout: Optional[float] = None) -> bool:
        """Wait until the current reply has ended; whether it did."""
        reply = self.session.current
        return reply is None or reply.wait(timeout)

    @property
    def last_reply(self) -> str:
        """The text of the last reply that ended ("" before any)."""
        return self.session.last.text if self.session.last is not None else ""


def chat(cluster: Any = None, *, path: Optional[str] = None, pipeline: bool = False, model: str = "model",
         tokenizer: str = "tokenizer", system: Optional[str] = None, temperature: float = 0.0, top_p: float = 1.0,
         max_tokens: int = 256, seed: Optional[int] = None, timeout: Optional[float] = None) -> ChatBox:
    """A chat box with the model on ``cluster``'s ranks (default: the magics' cluster).

    With ``path`` (an MLX-LM model folder, on every rank's host), first load it sharded into the
    ranks' names ``model`` and ``tokenizer``: tensor parallel, or ``pipeline`` parallel; without,
    use the model and tokenizer those names already hold. ``system``: a system prompt.
    """
    if cluster is None:
        from mlx_jupyter.magics import current

        cluster = current()
        if cluster is None:
            raise RuntimeError("no cluster: start one (%mlx_cluster start) or pass chat(cluster)")
    session = ChatSession(cluster, model, tokenizer, system,
                          Settings(temperature=temperature, top_p=top_p, max_tokens=max_tokens, seed=seed))
    if path is not None:
        session.load(path, pipeline, timeout)
    session.prepare()
    return ChatBox(session)
