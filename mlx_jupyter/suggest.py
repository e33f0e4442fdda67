""""Did you mean ...?" for mistyped commands, flags, choices and hostfile keys.

Python 3.11's argparse has no ``suggest_on_error``; :class:`ArgumentParser` adds it with difflib.
"""

from __future__ import annotations

import argparse
import difflib
import re
import sys
from typing import Any, Iterable, NoReturn, Optional, Sequence


def closest(word: str, choices: Iterable[str]) -> Optional[str]:
    """The choice ``word`` most likely mistypes (difflib's ratio, as CPython 3.14's argparse), or None."""
    found = difflib.get_close_matches(word, list(choices), n=1, cutoff=0.6)
    return found[0] if found else None


def did_you_mean(word: str, choices: Iterable[str]) -> str:
    """``" (did you mean 'launch'?)"`` or ``""``."""
    match = closest(word, choices)
    return f" (did you mean {match!r}?)" if match is not None else ""


def edit_distance(a: str, b: str) -> int:
    """Edits (insert, delete, substitute, swap two neighbours) that turn ``a`` into ``b``."""
    prev2: list[int] = []
    prev = list(range(len(b) + 1))
    for i in range(1, len(a) + 1):
        row = [i] + [0] * len(b)
        for j in range(1, len(b) + 1):
            row[j] = min(prev[j] + 1, row[j - 1] + 1, prev[j - 1] + (a[i - 1] != b[j - 1]))
            if i > 1 and j > 1 and a[i - 1] == b[j - 2] and a[i - 2] == b[j - 1]:
                row[j] = min(row[j], prev2[j - 2] + 1)
        prev2, prev = prev, row
    return prev[-1]


def typo_of(key: str, known: Iterable[str]) -> Optional[str]:
    """The known key ``key`` mistypes: one edit away (case aside), or two from a key of 5+ letters.

    Farther keys are not typos: ``"id"`` is not ``"ips"``, ``"note"`` is not ``"hosts"``.
    """
    if len(key) > 64:
        return None
    for name in known:
        distance = edit_distance(key.lower(), name)
        if distance <= 1 or (distance == 2 and len(name) >= 5):
            return name
    return None


_CHOICE = re.compile(r"argument (?P<flag>\S+): invalid choice: (?P<value>'[^']*')")


class ArgumentParser(argparse.ArgumentParser):
    """argparse with "did you mean" on an unknown flag (``--hots``) and an invalid choice (``rign``),
    whichever error argparse reports first (a missing required flag may hide the unknown one)."""

    _argv: list[str] = []

    def parse_known_args(self, args: Optional[Sequence[str]] = None, namespace: Any = None) -> Any:
        self._argv = list(sys.argv[1:] if args is None else args)
        return super().parse_known_args(args, namespace)

    def error(self, message: str) -> NoReturn:
        super().error(message + self._suggestion(message))

    def _suggestion(self, message: str) -> str:
        found = _CHOICE.match(message)
        if found:
            for action in self._actions:
                if action.choices and found["flag"] in ("/".join(action.option_strings), action.metavar, action.dest):
                    return did_you_mean(found["value"].strip("'"), [str(c) for c in action.choices])
        flags = [s for a in self._actions for s in a.option_strings if s.startswith("--")]
        words = dict.fromkeys(w.split("=", 1)[0] for w in self._argv if w.startswith("--") and len(w) > 2)
        pairs = [(w, match) for w in words if w not in flags and (match := closest(w, flags))]
        if len(pairs) == 1:
            return f" (did you mean {pairs[0][1]} for {pairs[0][0]}?)"
        return f" (did you mean {', '.join(f'{m} for {w}' for w, m in pairs)}?)" if pairs else ""
