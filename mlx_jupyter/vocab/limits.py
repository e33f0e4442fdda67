"""Numeric options checked one way for every entry point (the CLIs, the magics, the panel's server).

A number of seconds is finite, above 0 and at most a bound; a count is a whole number in its
range. A refusal is an :class:`OptionError` naming the flag, what it takes and an example.
"""

from __future__ import annotations

import argparse
import math
from typing import Any, Callable

#: the longest wait any flag takes (a week): anything longer is a typo, or means "no timeout"
MAX_SECONDS = 7 * 24 * 3600.0
#: ssh's connect timeout and keepalive interval: at most an hour
MAX_SSH_SECONDS = 3600.0
#: ranks per host (-n): more than this is a typo, and would not fit the ports of one host
MAX_RANKS_PER_HOST = 1024
#: ranks of one launch in all (hosts times -n): past it, a hostfile or host list is a mistake
MAX_RANKS = 1024
#: Slurm nodes (--nodes)
MAX_NODES = 65536
#: ring connections per IP (--connections-per-ip)
MAX_CONNECTIONS_PER_IP = 64


class OptionError(ValueError):
    """A numeric option out of its range; ``flag`` names it, the message says what it takes."""

    def __init__(self, flag: str, value: Any, takes: str, example: str):
        shown = value if isinstance(value, str) else repr(value)
        super().__init__(f"{flag} {shown}: {takes}, e.g. {flag} {example}")
        self.flag, self.takes, self.example = flag, takes, example


def seconds(flag: str, value: Any, high: float = MAX_SECONDS, example: str = "30") -> float:
    """``value`` (a number or its text) as seconds: finite, above 0, at most ``high``."""
    takes = f"must be a number of seconds above 0 and at most {high:g}"
    try:
        number = float(value) if isinstance(value, (str, int, float)) and not isinstance(value, bool) else math.nan
    except (ValueError, OverflowError):
        number = math.nan
    if not (math.isfinite(number) and 0 < number <= high):
        raise OptionError(flag, value, takes, example)
    return number


def count(flag: str, value: Any, high: int, low: int = 1, what: str = "a whole number", example: str = "2") -> int:
    """``value`` (an int or its text) as a whole number from ``low`` to ``high``."""
    takes = f"must be {what} from {low} to {high}"
    number: int | None = None
    if isinstance(value, int) and not isinstance(value, bool):
        number = value
    elif isinstance(value, str) and len(value) < 32:
        try:   # not str.isdigit: "²" is a digit that int() refuses
            number = int(value)
        except ValueError:
            number = None
    if number is None or not low <= number <= high:
        raise OptionError(flag, value, takes, example)
    return number


def ranks_per_host(flag: str, value: Any) -> int:
    """``-n``: ranks per host."""
    return count(flag, value, MAX_RANKS_PER_HOST, what="a number of ranks per host")


def port(flag: str, value: Any) -> int:
    """A TCP port."""
    return count(flag, value, 65535, what="a port", example="32323")


def arg_type(check: Callable[..., Any], flag: str, **kw: Any) -> Callable[[str], Any]:
    """``check`` as an argparse ``type=`` (argparse names the flag itself, so the message is what it takes)."""

    def convert(text: str) -> Any:
        try:
            return check(flag, text, **kw)
        except OptionError as exc:
            raise argparse.ArgumentTypeError(f"{text!r} {exc.takes} (e.g. {flag} {exc.example})") from None

    convert.__name__ = flag.lstrip("-").replace("-", "_") or "value"   # argparse's "invalid <name> value"
    return convert
