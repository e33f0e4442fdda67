"""Shell quoting for commands run on a remote host: words that arrive literally, exports, /bin/sh."""

from __future__ import annotations

import os
import re
import shlex
from typing import Sequence

#: Environment variable names we export on a remote host.
_ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


class QuotingError(ValueError):
    """A value cannot be passed to a remote shell literally (e.g. it contains NUL)."""


def quote(value: str | os.PathLike[str]) -> str:
    """Quote one word for a POSIX shell so that it arrives literally (NUL refused)."""
    text = os.fspath(value)
    if "\0" in text:
        raise QuotingError(f"{text!r}: a NUL byte cannot be passed through a shell")
    return shlex.quote(text)


def join(argv: Sequence[str | os.PathLike[str]]) -> str:
    """Quote every word of ``argv`` and join them with spaces."""
    return " ".join(quote(a) for a in argv)


def check_name(name: str) -> str:
    """Return ``name`` if it is a shell variable name, else raise :class:`QuotingError`."""
    if not _ENV_NAME.match(name):
        raise QuotingError(f"{name!r} is not a valid environment variable name ([A-Za-z_][A-Za-z0-9_]*)")
    return name


def export(name: str, value: str) -> str:
    """``export NAME='value'``; the name must be a shell identifier."""
    return f"export {check_name(name)}={quote(value)}"


def sh_command(script: str) -> str:
    """Run ``script`` under ``/bin/sh`` whatever the remote login shell is (bash, zsh, ...)."""
    return f"exec /bin/sh -c {quote(script)}"
