"""Where a launch's rank output goes: the caller's callbacks, else this process's terminal."""

from __future__ import annotations

import sys
from typing import Callable

from mlx_jupyter.launch.launch_config import LaunchConfig
from mlx_jupyter.launch.rankinfo import rank_prefix
from mlx_jupyter.launch.terminal import TERMINAL


class RankOutput:
    """``(rank, stream, text, ends)`` in, from the streams' splitters (:class:`~.streams.LineSplitter`).

    ``config.on_text`` gets each piece as it comes, ``ends`` telling whether it ends its line.
    ``config.on_output`` gets one call per line as ever, and an unfinished line's pieces one call each
    (a prompt shows; the rest of the line comes in the call its newline ends). With neither, the text goes
    to this process's terminal, prefixed with ``[rank r]`` when ``size()`` is above 1.
    """

    def __init__(self, config: LaunchConfig, size: Callable[[], int]):
        self.config, self.size = config, size

    def __call__(self, rank: int, stream: str, text: str, ends: bool = True) -> None:
        c = self.config
        if c.on_text is None and c.on_output is None:
            size = self.size()
            TERMINAL.write(rank, stream, text, ends, rank_prefix(rank, size) if size > 1 else "", breaks=size > 1)
            return
        try:   # a user callback must not kill the launcher
            if c.on_text is not None:
                c.on_text(rank, stream, text, ends)
            if c.on_output is not None:
                c.on_output(rank, stream, text)
        except Exception as exc:  # noqa: BLE001
            print(f"mlx-jupyter launch: output callback failed: {exc!r}", file=sys.stderr)
