"""The notebook's side of a chat, without widgets: the history, the settings, one reply at a time
run on every rank (:mod:`mlx_jupyter.chatbox.ranks`) and read as it comes, and its Stop.

A reply is a cell run (``cluster.run``) that does not block the notebook: a thread reads its
events, rank 0's text among them, and hands them to the :class:`Reply` (and its callback), so that
the kernel stays free for the Stop button: the cluster's agreed stop (``stop_soon``), which
stops every rank before the same MLX collective.
"""

from __future__ import annotations

import random
import re
import threading
import time
import uuid
from dataclasses import dataclass, field
from typing import Any, Callable, Optional, Protocol, Sequence

from mlx_jupyter.chatbox import events

_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


class ChatCluster(Protocol):
    """What a chat needs of a cluster (a ``Cluster`` or a ``ConnectedCluster``)."""

    @property
    def ranks(self) -> list[int]: ...
    def stop_soon(self, run: Any) -> None: ...  # issue 42's agreed stop, on a thread
    def run(self, code: str, targets: Optional[Sequence[int]] = None, release_deadline: float = 2.0,
            init: bool = True, profile: bool = False) -> Any: ...
    def execute(self, code: str, targets: Optional[Sequence[int]] = None, timeout: Optional[float] = None,
                init: bool = True) -> list[Optional[str]]: ...


@dataclass
class Settings:
    """How replies are sampled: ``temperature`` 0 is greedy; ``seed`` None draws one per reply."""

    temperature: float = 0.0
    top_p: float = 1.0
    max_tokens: int = 256
    seed: Optional[int] = None


@dataclass
class Reply:
    """One reply as the notebook sees it: its text so far, its numbers at the end, an error."""

    id: str
    prompt: str
    text: str = ""
    stats: Optional[events.Stats] = None
    error: str = ""
    log: str = ""  # what the ranks printed meanwhile
    started: float = field(default_factory=time.monotonic)
    first_text_s: Optional[float] = None  # seconds from the send to the notebook's first text
    over: bool = False  # every rank has ended it (set before the last update, which ``done`` follows)
    stopping: bool = False  # its Stop was asked (ranks it stopped before they made an MLX call end released)
    run: Any = None  # its cell run on the ranks
    done: threading.Event = field(default_factory=threading.Event)
    _cond: threading.Condition = field(default_factory=threading.Condition)

    def add_text(self, text: str) -> None:
        with self._cond:
            if self.first_text_s is None:
                self.first_text_s = time.monotonic() - self.started
            self.text += text
            self._cond.notify_all()

    def finish(self) -> None:
        with self._cond:
            self.done.set()
            self._cond.notify_all()

    def wait_for_text(self, chars: int = 1, timeout: float = 30.0) -> bool:
        """Wait until ``chars`` characters have come, or the reply ended; whether they came."""
        with self._cond:
            self._cond.wait_for(lambda: len(self.text) >= chars or self.done.is_set(), timeout)
            return len(self.text) >= chars

    def wait(self, timeout: Optional[float] = None) -> bool:
        """Wait for the reply's end; whether it ended."""
        return self.done.wait(timeout)


class ChatSession:
    """A chat with the model bound to ``model`` and ``tokenizer`` on every rank of ``cluster``."""

    def __init__(self, cluster: ChatCluster, model: str = "model", tokenizer: str = "tokenizer",
                 system: Optional[str] = None, settings: Optional[Settings] = None) -> None:
        for name in (model, tokenizer):
            if not _NAME.match(name):
                raise ValueError(f"{name!r} is not a Python name on the ranks")
        self.cluster, self.model, self.tokenizer = cluster, model, tokenizer
        self.system = system
        self.settings = settings or Settings()
        self.history: list[dict[str, str]] = []
        self.current: Optional[Reply] = None
        self.last: Optional[Reply] = None
        self._lock = threading.Lock()

    def load(self, path: str, pipeline: bool = False, timeout: Optional[float] = None) -> None:
        """Load the MLX-LM model folder ``path`` sharded over the ranks (tensor, or ``pipeline``
        parallel) into the chat's two names."""
        self.cluster.execute(
            f"{self.model}, {self.tokenizer} = __import__('mlx_jupyter.models.sharded', fromlist=['load_sharded'])"
            f".load_sharded({str(path)!r}, pipeline={bool(pipeline)})", timeout=timeout)

    def prepare(self, timeout: Optional[float] = 60.0) -> None:
        """Check that the ranks hold the model and tokenizer."""
        self.cluster.execute(f"{self.model}, {self.tokenizer}\nNone", timeout=timeout)

    @property
    def busy(self) -> bool:
        return self.current is not None and not self.current.done.is_set()

    def messages(self, prompt: str) -> list[dict[str, str]]:
        """The chat so far with ``prompt`` as the user's next message (the system prompt first)."""
        head = [{"role": "system", "content": self.system}] if self.system else []
        return head + self.history + [{"role": "user", "content": prompt}]

    def send(self, prompt: str, on_update: Optional[Callable[[Reply], None]] = None) -> Reply:
        """Start the reply to ``prompt`` on every rank; returns at once (the :class:`Reply` fills as
        rank 0's text comes; ``on_update(reply)`` after each piece and at the end)."""
        with self._lock:
            if self.busy:
                raise RuntimeError("a reply is still being generated: stop it or wait for it")
            s = self.settings
            seed = s.seed if s.seed is not None else random.getrandbits(31)
            settings = {"temperature": float(s.temperature), "top_p": float(s.top_p),
                        "max_tokens": int(s.max_tokens), "seed": int(seed)}
            reply = Reply(id=uuid.uuid4().hex, prompt=prompt)
            code = (f"__import__('mlx_jupyter.chatbox.ranks', fromlist=['reply']).reply({self.model}, {self.tokenizer}, "
                    f"{self.messages(prompt)!r}, {settings!r}, {reply.id!r})")
            run = reply.run = self.cluster.run(code)
            self.current = reply
        threading.Thread(target=self._follow, args=(run, reply, on_update), name="mlx-chat-reply", daemon=True).start()
        return reply

    def _follow(self, run: Any, reply: Reply, on_update: Optional[Callable[[Reply], None]]) -> None:
        """The reply's thread: rank 0's events to ``reply`` until every rank has ended the cell."""
        try:
            while not (run.done.is_set() and run.events.empty()):
                ev = run.next_event(0.1)
                run.check_deadlines()
                if ev is None:
                    continue
                if ev.kind == "display" and ev.rank == 0:
                    event = events.parse(ev.payload)
                    if event is not None and "text" in event:
                        reply.add_text(str(event["text"]))
                    elif event is not None and "end" in event:
                        reply.stats = events.Stats.from_event(event["end"])
                    if event is not None and on_update is not None:
                        on_update(reply)
                elif ev.kind == "stream":
                    reply.log += f"[rank {ev.rank}] {ev.payload[1]}"
            # the Stop found no rank in an MLX call (the prompt's template, say): they were interrupted
            interrupted = reply.stopping and all(o.status == "released" for o in run.outcomes.values())
            if interrupted:
                reply.stats = reply.stats or events.Stats(finish="stopped")
            if run.failed and not interrupted:
                from mlx_jupyter.cluster.cells.display import failure

                reply.error = str(failure(run))
            elif not run.failed or reply.text:   # a stopped reply's text so far is the chat's too
                self.history += [{"role": "user", "content": reply.prompt},
                                 {"role": "assistant", "content": reply.text}]
        except Exception as e:  # the reply's thread never dies silently: the box shows why
            reply.error = f"{type(e).__name__}: {e}"
        finally:
            self.last, reply.over = reply, True
            try:
                if on_update is not None:
                    on_update(reply)
            finally:
                reply.finish()

    def stop(self) -> bool:
        """End the current reply on every rank before the same MLX collective (the agreed stop), without
        blocking the caller; whether one was running."""
        reply = self.current
        if reply is None or reply.done.is_set() or reply.stopping:
            return reply is not None and not reply.done.is_set()
        reply.stopping = True
        self.cluster.stop_soon(reply.run)
        return True

    def reset(self) -> None:
        """Forget the chat so far (the model stays loaded); refused while a reply runs."""
        if self.busy:
            raise RuntimeError("a reply is still being generated: stop it first")
        self.history = []
