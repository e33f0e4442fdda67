"""Ranks' unfinished lines shown as they come: one line continued while the same ranks write it, their
label only at its start, a line break only where other output comes between (pure: the writers are given)."""

from __future__ import annotations

import os
from typing import Callable, Mapping, Optional, Sequence

from mlx_jupyter.cluster.cells.text import group_equal

Writer = Callable[[str], None]


class OpenLine:
    """The one line of a cell's output left open for more of it, across both streams.

    :meth:`lines` and :meth:`partials` return the text to write on their stream; a line open on the other
    stream is ended there directly first (a notebook shows a stream's text after the other's below it).
    """

    def __init__(self, writers: Mapping[str, Writer], label: Callable[[Sequence[int]], str]):
        self._writers, self._label = writers, label
        self._open: Optional[tuple[str, tuple[int, ...], str]] = None   # (stream, ranks, text shown)
        self._cut: dict[tuple[str, int], str] = {}   # (stream, rank) -> what was shown of its line before a break

    def close(self) -> None:
        """End the open line, if any (other output comes next)."""
        if self._open is not None:
            self._writers[self._open[0]](self._end())

    def started(self, stream: str) -> set[int]:
        """The ranks whose current line on ``stream`` is shown in part (open, or broken off)."""
        if self._open is None and not self._cut:
            return set()
        ranks = {r for s, r in self._cut if s == stream}
        if self._open is not None and self._open[0] == stream:
            ranks.update(self._open[1])
        return ranks

    def lines(self, stream: str, items: Sequence[tuple[list[int], str]]) -> str:
        """The text showing complete lines ``(ranks, line)``: the rest of the open line, or ``[label] line``."""
        out: list[str] = []
        for ranks, line in (part for item in items for part in self._split(stream, *item)):
            if self._open is not None and self._open[:2] == (stream, tuple(ranks)) and line.startswith(self._open[2]):
                out.append(line[len(self._open[2]):] + "\n")
                self._open = None
                continue
            out.append(self._close_for(stream))
            start = self._shown(stream, ranks, line, forget=True)
            if start < len(line) or not start:
                out.append(f"[{self._label(ranks)}] {line[start:]}\n")
        return "".join(out)

    def partials(self, stream: str, partials: Mapping[int, str], grouped: bool = True) -> str:
        """The text showing the ranks' unfinished lines (``{rank: its text so far}``) as far as they grew."""
        out: list[str] = []
        if self._open is not None and self._open[0] == stream:
            writing, shown = self._open[1], self._open[2]
            if all(r in partials for r in writing):
                common = os.path.commonprefix([partials[r] for r in writing])
                if len(common) > len(shown) and common.startswith(shown):
                    out.append(common[len(shown):])
                    self._open = (stream, writing, common)
            partials = {r: p for r, p in partials.items() if r not in writing}
        groups = group_equal(partials) if grouped else [([r], p) for r, p in sorted(partials.items())]
        for ranks, text in groups:
            start = self._shown(stream, ranks, text, forget=False)
            if start == len(text):   # nothing new since its line was broken
                continue
            out.append(self._close_for(stream))
            self._shown(stream, ranks, text, forget=True)
            out.append(f"[{self._label(ranks)}] {text[start:]}")
            self._open = (stream, tuple(ranks), text)
        return "".join(out)

    def _split(self, stream: str, ranks: list[int], line: str) -> list[tuple[list[int], str]]:
        """``ranks`` grouped by how much of ``line`` each has shown already, so no rank's start shows twice."""
        groups: dict[str, list[int]] = {}
        for r in ranks:
            shown = self._cut.get((stream, r), "")
            if self._open is not None and self._open[0] == stream and r in self._open[1]:
                shown = self._open[2]
            groups.setdefault(shown if line.startswith(shown) else "", []).append(r)
        return [(rs, line) for rs in groups.values()]

    def _shown(self, stream: str, ranks: Sequence[int], text: str, forget: bool) -> int:
        """How much of ``text`` is shown already: the start every one of ``ranks`` had shown before a break."""
        cut = {self._cut.pop((stream, r), None) if forget else self._cut.get((stream, r)) for r in ranks}
        shown = cut.pop() if len(cut) == 1 else None
        return len(shown) if shown is not None and text.startswith(shown) else 0

    def _close_for(self, stream: str) -> str:
        """End the open line before other output on ``stream``: its ``\\n`` returned when it is on ``stream``."""
        if self._open is None:
            return ""
        if self._open[0] == stream:
            return self._end()
        self.close()
        return ""

    def _end(self) -> str:
        assert self._open is not None
        stream, ranks, shown = self._open
        for r in ranks:
            self._cut[(stream, r)] = shown
        self._open = None
        return "\n"
