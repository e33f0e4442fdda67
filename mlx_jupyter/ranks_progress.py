"""The ranks connected out of N while ``%mlx_cluster`` starts or restarts them: a display updated in place."""

from __future__ import annotations

import html
from typing import Any


class RanksProgressBar:
    """Ranks connected out of N: an updated display in a notebook (an HTML ``<progress>``, no
    widget: importing ipywidgets would be on the start's path), a text line elsewhere.

    When done, the display is replaced by the final line (one line, also in a saved
    notebook's outputs); the text line is overwritten by it.
    """

    def __init__(self, total_hint: int, title: str):
        self.handle: Any = None
        self.title = title
        self.have, self.total = 0, total_hint
        self.slurm = ""
        try:
            from IPython import get_ipython

            ip = get_ipython()
            if ip is not None and getattr(ip, "kernel", None) is not None:
                from IPython.display import display

                self.handle = display(self._data(), raw=True, display_id=True)
        except Exception:
            self.handle = None

    def _line(self) -> str:
        if self.slurm and not self.have:
            return f"{self.title}: {self.slurm}"
        return f"{self.title}: {self.have}/{self.total} ranks connected" + (f" ({self.slurm})" if self.slurm else "")

    def slurm_state(self, state: Any) -> None:
        """The Slurm job's state while it waits for nodes (``Slurm job 12 PENDING (Resources)``)."""
        self.slurm = f"Slurm job {state.job_id} {state.describe()}"
        self(self.have, self.total)

    def _data(self) -> dict[str, str]:
        return {"text/plain": self._line(),
                "text/html": f"<progress value='{self.have}' max='{max(self.total, 1)}'></progress> "
                             f"{html.escape(self._line())}"}

    def __call__(self, have: int, total: int) -> None:
        self.have, self.total = have, total
        if self.handle is not None:
            try:
                self.handle.update(self._data(), raw=True)
                return
            except Exception:
                self.handle = None
        print(f"\r{self._line()}", end="", flush=True)

    def done(self, text: str) -> None:
        """Replace the progress by ``text``."""
        if self.handle is None:
            shown = len(self._line()) if self.have else 0
            print(f"\r{text.ljust(shown)}" if shown else text, flush=True)
            return
        try:
            self.handle.update({"text/plain": text}, raw=True)
        except Exception:  # a front end without display updates: say it the plain way
            print(text)

    def failed(self) -> None:
        """Replace the progress by where it stopped (the error, raised next, says why)."""
        self.done(f"{self._line()}, then it failed (below)")
