"""Whether a remote host can run the launch's backend (nccl, jaccl), asked on the ssh session the launcher
opens anyway (each connection's watchdog): the answer comes back before any rank starts there.

The host's own Python (the ranks' interpreter) answers as ``mlx-jupyter doctor`` would there: with
mlx_jupyter installed, its probe of the machine and the MLX build; else MLX's ``is_available``; else
nothing (the launch goes on, as for a command that is not Python).
"""

from __future__ import annotations

import asyncio
import os
from typing import Mapping, Optional, Protocol, Sequence

from mlx_jupyter.launch.errors import LaunchError
from mlx_jupyter.launch.launch_config import interpreter_of
from mlx_jupyter.launch.local import CHECK_VAR, CHECKED_BACKENDS
from mlx_jupyter.net.ssh import quote

#: the first word of the answer's line on the watchdog's stdout
MARKER = "\x1emlx-jupyter-backend"
#: the most a probe may take (one Python start that imports MLX) before the launch goes on unchecked
PROBE_SECONDS = 20.0

# Prints "yes", "no <why>" or "unknown", one line. Plain Python 3 for any interpreter the host has.
_PROBE = """import sys
b = sys.argv[1]
try:
    from mlx_jupyter.distributed import backends
    row = [r for r in backends() if r["name"] == b][0]
    print("yes" if row["available"] else "no " + " ".join(str(row["detail"]).split()))
except Exception:
    try:
        import mlx.core as mx
        print("yes" if mx.distributed.is_available(b) else "no this MLX build has no " + b)
    except Exception:
        print("unknown")
"""


def probe_script(backend: str, argv: Sequence[str], environ: Optional[Mapping[str, str]] = None) -> str:
    """The shell lines that ask the host, in the background of the watchdog's session ('' when there is
    nothing to ask: a backend every host has, a command that is not Python, or ``MLX_JUPYTER_CHECK_BACKEND=0``)."""
    python = interpreter_of(argv, local=False)
    if backend not in CHECKED_BACKENDS or python is None or (os.environ if environ is None else environ).get(CHECK_VAR) == "0":
        return ""
    ask = f"{quote(python)} -c {quote(_PROBE)} {quote(backend)} </dev/null 2>/dev/null"
    return f"( a=$({ask}) || a=unknown; printf '%s %s\\n' {quote(MARKER)} \"${{a:-unknown}}\" ) &\n"


class LineReader(Protocol):
    """The watchdog session's stdout (asyncssh's ``SSHReader``, bytes)."""

    async def readline(self) -> bytes: ...


async def read_answer(stdout: LineReader, timeout: float = PROBE_SECONDS) -> str:
    """The host's answer on the watchdog's stdout after its first line: 'yes', 'no <why>' or 'unknown'
    (also when it does not come within ``timeout`` s: the launch is not held up by a slow host)."""
    marker = MARKER.encode() + b" "
    try:
        while True:
            line = await asyncio.wait_for(stdout.readline(), timeout)
            if not line:
                return "unknown"
            if line.startswith(marker):
                return line[len(marker):].decode(errors="replace").strip() or "unknown"
    except Exception:  # noqa: BLE001 - timeout or a broken session: the ranks' start reports the host
        return "unknown"


def refusal(backend: str, answers: Mapping[str, str]) -> Optional[str]:
    """One line refusing ``backend`` on the hosts whose answer (host -> answer) is 'no ...', hosts with the
    same reason together; None when none said no."""
    why: dict[str, list[str]] = {}
    for host, answer in answers.items():
        if answer.startswith("no"):
            why.setdefault(answer[2:].strip(), []).append(host)
    if not why:
        return None
    parts = [", ".join(hosts) + (f" ({reason})" if reason else "") for reason, hosts in why.items()]
    return (f"the {backend} backend cannot run on " + "; nor on ".join(parts) +
            f": run `mlx-jupyter doctor` there ({CHECK_VAR}=0 starts the ranks anyway)")


async def refuse_unavailable(answers: Mapping[str, "asyncio.Future[str]"], backend: str) -> None:
    """LaunchError, in one line, naming every host (``answers``: host -> its pending answer) that cannot run ``backend``."""
    if not answers:
        return
    got = await asyncio.gather(*answers.values())
    line = refusal(backend, dict(zip(answers, got)))
    if line is not None:
        raise LaunchError(line)
