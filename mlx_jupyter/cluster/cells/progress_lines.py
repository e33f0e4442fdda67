"""The ranks' progress lines (text rewritten with ``\\r``, e.g. a tqdm text bar), each shown in place.

One display per stream, updated as the lines change (IPython's display handles); cleared when the
lines end, whose final text is then written as ordinary output. Without a kernel front end (a
terminal) nothing live is shown: only the final lines.
"""

from __future__ import annotations

from typing import Any, Callable, Optional

#: shows ``text`` (the first call creates the display), returns the handle to update next time
Show = Callable[[Any, str], Any]


def _ipython_show(handle: Any, text: str) -> Any:
    """Create or update a display holding ``text`` (pre-formatted, so the columns of bars line up)."""
    import html

    data = {"text/plain": text, "text/html": f"<pre>{html.escape(text)}</pre>" if text else ""}
    if handle is not None:
        handle.update(data, raw=True)
        return handle
    from IPython import get_ipython
    from IPython.display import display

    ip = get_ipython()
    if ip is None or getattr(ip, "kernel", None) is None:
        return None  # no front end that updates displays: the final lines are enough
    return display(data, raw=True, display_id=True)  # type: ignore[no-untyped-call]  # IPython's, untyped


class LiveLines:
    """The current progress lines of one stream: ``show({label: line})`` as often as they change."""

    def __init__(self, show: Optional[Show] = None):
        self._show = show or _ipython_show
        self._handle: Any = None
        self._text = ""

    @property
    def shown(self) -> bool:
        """Whether the display is made (later lines update it in place)."""
        return self._handle is not None

    def show(self, lines: list[tuple[str, str]]) -> None:
        """Show ``(label, line)`` pairs as ``[label] line`` rows; an empty list clears the display."""
        text = "\n".join(f"[{label}] {line}" for label, line in lines)
        if text == self._text or (not text and self._handle is None):
            return
        self._text = text
        try:
            self._handle = self._show(self._handle, text)
        except Exception:  # a front end that refuses updates: the final lines still come as text
            self._handle = None
