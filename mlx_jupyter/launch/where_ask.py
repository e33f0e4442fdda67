"""Asking a launch's ranks where they are (``--where-on-signal``): a signal out, one line back from each.

Every kind of launch reaches its ranks with SIGUSR1 its own way (local and ssh ranks: their
process groups, remote ones through each host's watchdog; ``--backend mpi``: mpirun, which
passes SIGUSR1 on to every rank; Slurm: ``scancel --signal=USR1`` on the step). A rank started
through :mod:`mlx_jupyter.where.boot` answers with one line on its stderr
(:mod:`mlx_jupyter.where.signal_report`), which comes back with the rest of that rank's output:
the launch's output reader hands every line to :meth:`WhereAnswers.line` first.
"""

from __future__ import annotations

import asyncio
import sys
from typing import TYPE_CHECKING, Any, Awaitable, Callable, Mapping, Optional, Sequence

from mlx_jupyter.vocab.rankinfo import RankInfo, describe_exit
from mlx_jupyter.where import boot, signal_report

if TYPE_CHECKING:
    from mlx_jupyter.where.model import Where

#: a running rank that sent no where line in time
NO_ANSWER = "no answer (its stack, if printed, is above)"
#: a running rank that was not started to answer (not Python, or no --where-on-signal): never signalled
NOT_ASKED = "running (not started to answer SIGUSR1)"

#: one rank's answer: the JSON object its where line carries (:func:`mlx_jupyter.where.signal_report.parse`)
Sample = dict[str, Any]


class WhereAnswers:
    """The ranks' answers to the last where signal (rank -> sample)."""

    def __init__(self) -> None:
        self.samples: dict[int, Sample] = {}
        self.asked: set[int] = set()
        self.booted = False  # the ranks run through the boot code: only then may they be signalled
        self._answered: Optional[asyncio.Event] = None
        self._midline: set[tuple[int, str]] = set()          # (rank, stream) whose line came in part so far
        self._gathering: dict[tuple[int, str], str] = {}     # ... and began as a where answer: its text so far

    def boot(self, argv: list[str], where_on_signal: bool) -> list[str]:
        """``argv`` started through the where boot code when the launch asked for it (else unchanged:
        a rank that is not Python would die of SIGUSR1, so it is never sent one)."""
        if not where_on_signal:
            return argv
        wrapped = boot.wrap(argv)
        if wrapped is None:
            shown = " ".join(argv[:3]) + (" ..." if len(argv) > 3 else "")
            print(f"mlx-jupyter launch: --where-on-signal: {shown!r} does not run a Python script, module or -c "
                  "command; SIGUSR1 will show only the ranks' states", file=sys.stderr)
        self.booted = wrapped is not None
        return wrapped or argv

    def line(self, rank: int, stream: str, text: str) -> bool:
        """True when ``text`` (a line of rank ``rank``'s output) was its where answer, kept here."""
        if stream != "stderr" or not text.startswith(signal_report.MARKER):
            return False
        sample = signal_report.parse(text)
        if sample is None:
            return False
        self.samples[rank] = sample
        if self._answered is not None and self.asked <= set(self.samples):
            self._answered.set()
        return True

    def piece(self, rank: int, stream: str, text: str, ends: bool) -> Optional[str]:
        """:meth:`line` for output that comes in pieces (``ends``: this one ends its line): None when the piece
        is (part of) a where answer, kept here; else the text to show (a gathered line that was none, whole)."""
        key = (rank, stream)
        gathered = self._gathering.pop(key, None)
        at_start = gathered is None and key not in self._midline
        if ends:
            self._midline.discard(key)
        else:
            self._midline.add(key)
        if gathered is None and not (at_start and stream == "stderr" and text.startswith(signal_report.MARKER)):
            return text
        text = (gathered or "") + text
        if not ends:
            self._gathering[key] = text
            return None
        return None if self.line(rank, stream, text) else text

    async def ask(self, ranks: Sequence[int], send: Callable[[], Awaitable[None]], timeout: float) -> dict[int, Sample]:
        """``send()`` the signal (to ranks started through the boot code only), then the answers of ``ranks``
        that came within ``timeout`` s."""
        self.samples, self.asked = {}, set(ranks)
        self._answered = asyncio.Event()
        if ranks and self.booted:
            await send()
            try:
                await asyncio.wait_for(self._answered.wait(), timeout)
            except asyncio.TimeoutError:
                pass
        return dict(self.samples)


def ended_words(info: RankInfo) -> str:
    """A rank that is not running, in the where table's words."""
    if info.returncode is None:
        return info.state
    return "done" if info.returncode == 0 else f"ended ({describe_exit(info.returncode)})"


def table(samples: Mapping[int, Sample], ended: Mapping[int, str], ranks: Sequence[int], asked: bool = True) -> "Where":
    """The :class:`~mlx_jupyter.where.model.Where` of a launch: a running rank without an answer says why
    (``asked``: the ranks were signalled)."""
    from mlx_jupyter.where import model

    words = dict(ended)
    words.update({r: NO_ANSWER if asked else NOT_ASKED for r in ranks if r not in samples and r not in words})
    return model.Where(model.rows(samples, words, list(ranks)), "where the ranks are")
