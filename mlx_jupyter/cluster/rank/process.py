"""Small facts and settings of a rank's process: its memory, how it shows figures and progress bars."""

from __future__ import annotations

import importlib.abc
import importlib.util
import sys
from typing import Any


def rss() -> int:
    """This process's resident memory in bytes (its peak where psutil is missing)."""
    try:
        import psutil

        return int(psutil.Process().memory_info().rss)
    except Exception:
        import resource

        scale = 1 if sys.platform == "darwin" else 1024
        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * scale


def _figure_png(fig: Any) -> Any:
    from IPython.core.pylabtools import print_figure

    return print_figure(fig, "png")  # type: ignore[no-untyped-call]  # IPython's, untyped


def register_figure_png(shell: Any) -> None:
    """``display(fig)`` shows a matplotlib figure as PNG whatever the backend (Agg too).

    The inline backend registers this itself, but only once it is loaded: a rank
    that chose another backend (``matplotlib.use("Agg")``) would show only text.
    By name, so matplotlib is not imported before a cell needs it.
    """
    try:
        shell.display_formatter.formatters["image/png"].for_type_by_name("matplotlib.figure", "Figure", _figure_png)
    except Exception:  # no display formatter: nothing to show figures with anyway
        pass


def _text_notebook_bar() -> type:
    """tqdm's text bar, accepting what ``tqdm.notebook``'s bar takes beyond it (``display``)."""
    from tqdm.std import tqdm

    class tqdm_notebook(tqdm):  # type: ignore[misc]  # noqa: N801 - tqdm's own name; tqdm ships no types
        """tqdm's text bar in place of its notebook widget (a rank cannot show a widget)."""

        def __init__(self, *args: Any, **kwargs: Any) -> None:
            kwargs.pop("display", None)
            super().__init__(*args, **kwargs)

    tqdm_notebook.__module__, tqdm_notebook.__qualname__ = "tqdm.notebook", "tqdm_notebook"
    return tqdm_notebook


class _TextTqdm(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """``tqdm.notebook`` and ``tqdm.autonotebook`` (behind ``tqdm.auto``) give tqdm's text bar on a rank.

    A rank is an IPython kernel, so tqdm would choose its widget bar; but the widget's model lives
    in the rank, which the notebook cannot reach ("model not found"). The text bar's ``\\r``
    updates are shown in place, per rank, by the notebook side (cells.progress_lines).
    """

    MODULES = ("tqdm.autonotebook", "tqdm.notebook")

    def find_spec(self, name: str, path: Any = None, target: Any = None) -> Any:
        return importlib.util.spec_from_loader(name, self) if name in self.MODULES else None

    def create_module(self, spec: Any) -> None:
        return None

    def exec_module(self, module: Any) -> None:
        if module.__name__ == "tqdm.autonotebook":
            from tqdm.std import tqdm, trange

            module.tqdm, module.trange, module.__all__ = tqdm, trange, ["tqdm", "trange"]
            return
        bar = _text_notebook_bar()

        def tnrange(*args: Any, **kwargs: Any) -> Any:
            """``tqdm.notebook.trange``: the text bar over ``range(*args)``."""
            return bar(range(*args), **kwargs)

        module.tqdm = module.tqdm_notebook = bar
        module.trange = module.tnrange = tnrange
        module.__all__ = ["tqdm_notebook", "tnrange", "tqdm", "trange"]


def text_progress_bars() -> None:
    """Make ``tqdm.auto``, ``tqdm.autonotebook`` and ``tqdm.notebook`` give the text bar in this
    process (tqdm is imported only by a cell)."""
    if not any(isinstance(f, _TextTqdm) for f in sys.meta_path):
        sys.meta_path.insert(0, _TextTqdm())


def configure_output(shell: Any) -> None:
    """How a rank shows figures and progress bars (see the two functions above)."""
    register_figure_png(shell)
    text_progress_bars()
