"""What the widgets' actions run on: ssh (live) or a recorded cluster, and a way to run coroutines from a notebook."""

from __future__ import annotations

import asyncio
import threading
from pathlib import Path
from typing import Any, Awaitable, Callable, Sequence, TypeVar

from mlx_jupyter.topology import CommandResult, Recording

T = TypeVar("T")


class RecordingRunner:
    """A `config.Runner` that answers from a recorded cluster folder, as those Macs would."""

    def __init__(self, folder: str | Path) -> None:
        self.recording = Recording(folder)
        self.calls: list[tuple[str, tuple[str, ...]]] = []

    def hosts(self) -> list[str]:
        return self.recording.hosts()

    async def run(self, host: str, argv: Sequence[str]) -> CommandResult:
        self.calls.append((host, tuple(argv)))
        return self.recording.answer(host, argv)

    async def close(self) -> None:
        return None


def run_async(factory: Callable[[], Awaitable[T]], timeout: float = 300.0) -> T:
    """Run a coroutine to completion in its own thread and loop (works inside a running kernel loop)."""
    box: dict[str, Any] = {}

    def target() -> None:
        try:
            box["value"] = asyncio.run(factory())  # type: ignore[arg-type]
        except BaseException as exc:  # handed to the caller
            box["error"] = exc

    thread = threading.Thread(target=target, name="mlx-jupyter-widget-action", daemon=True)
    thread.start()
    thread.join(timeout)
    if thread.is_alive():
        raise TimeoutError(f"the action did not finish within {timeout:g} s")
    if "error" in box:
        raise box["error"]
    return box["value"]
