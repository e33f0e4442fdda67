"""Which ranks a selection names: the magics' ``--targets`` text and the Python API's ``targets``.

Pure. A selection that names no rank, a rank the cluster lacks or one rank twice is refused with
an error naming the flag or argument, the ranks that exist and the fix: a run on no rank would
never end (issue 44).
"""

from __future__ import annotations

from typing import Any, Optional, Sequence

#: the forms ``--targets`` takes, for its help and its errors
FORMS = "all, 0, 0,2, 1-3, :2 or 1:"


class TargetsError(ValueError):
    """A selection that could be read but names no rank, or one the cluster lacks."""


def _existing(size: int) -> str:
    return f"this cluster has {size} rank{'s' if size != 1 else ''} ({'0' if size == 1 else f'0-{size - 1}'})"


def _why_empty(spec: str, size: int) -> str:
    """Why ``spec`` (read, but naming no rank) is empty, and what to write instead."""
    if ":" in spec:
        lo, _, hi = spec.partition(":")
        if lo.strip() and int(lo) >= size:
            return f"the slice starts at {int(lo)}, past the last rank ({size - 1})"
        return "the slice ends before it starts"
    for part in spec.split(","):
        part = part.strip()
        first, sep, last = part[1:].partition("-")
        if sep and int(part[0] + first) > int(last):
            return f"the range {part} runs backwards (write {int(last)}-{int(part[0] + first)})"
    return "it names no rank"


def parse_targets(spec: str, size: int, flag: str = "--targets") -> list[int]:
    """``"0,2-3"`` / ``"all"`` / ``":2"`` -> sorted rank list, checked against ``size``.

    :class:`TargetsError` (naming ``flag``) for a selection of no rank or of a rank the cluster lacks;
    a plain ValueError (also naming ``flag``) for text that is not a selection."""
    spec = spec.strip()
    if spec in ("", "all", ":"):
        return list(range(size))
    ranks: set[int] = set()
    try:
        if ":" in spec:
            lo, _, hi = spec.partition(":")
            ranks.update(list(range(size))[slice(int(lo) if lo.strip() else None, int(hi) if hi.strip() else None)])
        else:
            for part in spec.split(","):
                part = part.strip()
                if "-" in part[1:]:
                    first, _, last = part[1:].partition("-")
                    ranks.update(range(int(part[0] + first), int(last) + 1))
                else:
                    ranks.add(int(part))
    except ValueError:
        raise ValueError(f"{flag} {spec}: not a selection of ranks; write it as {FORMS}") from None
    if not ranks:
        raise TargetsError(f"{flag} {spec} selects no rank: {_why_empty(spec, size)}; {_existing(size)}: "
                           f"give ranks among them, e.g. {flag} {_example(size)}, or {flag} all")
    bad = sorted(r for r in ranks if not 0 <= r < size)
    if bad:
        raise TargetsError(f"{flag} {spec}: no rank {', '.join(map(str, bad))} in a cluster of {size} ranks; "
                           f"{_existing(size)}: give ranks among them, or {flag} all")
    return sorted(ranks)


def _example(size: int) -> str:
    return "0" if size <= 1 else f"0-{size - 1}"


def check_targets(targets: Optional[Sequence[Any]], size: int, name: str = "targets") -> list[int]:
    """The ranks of the Python API's ``targets`` (None: every rank); :class:`TargetsError` naming
    ``name`` for none, a rank the cluster lacks, a rank named twice or a value that is not a rank."""
    if targets is None:
        return list(range(size))
    if isinstance(targets, (str, bytes)) or not hasattr(targets, "__iter__"):
        raise TargetsError(f"{name}={targets!r}: give a list of ranks, e.g. {name}=[0], or {name}=None for every "
                           f"rank; {_existing(size)}")
    ranks = list(targets)
    wrong = [r for r in ranks if isinstance(r, bool) or not isinstance(r, int)]
    if wrong:
        raise TargetsError(f"{name}={ranks!r}: {wrong[0]!r} is not a rank number; {_existing(size)}")
    if not ranks:
        raise TargetsError(f"{name}={targets!r} selects no rank, so nothing would run; {_existing(size)}: "
                           f"give {name}=None for every rank, or a list of ranks among them, e.g. "
                           f"{name}=[{', '.join(map(str, range(min(size, 2))))}]")
    bad = sorted({r for r in ranks if not 0 <= r < size})
    if bad:
        raise TargetsError(f"{name}={ranks!r}: no rank {', '.join(map(str, bad))} in this cluster; "
                           f"{_existing(size)}: give ranks among them, or {name}=None for every rank")
    twice = sorted({r for r in ranks if ranks.count(r) > 1})
    if twice:
        raise TargetsError(f"{name}={ranks!r} names rank {', '.join(map(str, twice))} more than once: "
                           f"give each rank once; {_existing(size)}")
    return ranks
