"""A process's identity: its pid and when it started, so that a pid recorded earlier is killed only
while it still names the process we started (pids are reused once a process is reaped).

The one seam for it. Linux: field 22 of ``/proc/PID/stat`` (start time in clock ticks since boot;
a zombie keeps it). Elsewhere (macOS): ``ps -o lstart= -p PID``. The shell watchdogs compute the
same token the same way (:data:`SHELL_START_TOKEN`), so a token written here is compared there.
"""

from __future__ import annotations

import os
import subprocess
from typing import Optional

#: sh function: `start_token PID` prints the token :func:`start_token` gives (nothing: no such process)
SHELL_START_TOKEN = r"""start_token() {
  if [ -r /proc/self/stat ]; then
    IFS= read -r _st_line 2>/dev/null </proc/"$1"/stat || return 0
    set -f; set -- ${_st_line##*) }; set +f
    printf '%s\n' "${20}"
  else
    LC_ALL=C TZ=UTC ps -o lstart= -p "$1" 2>/dev/null | tr -s ' ' | sed 's/^ //; s/ $//'
  fi
}"""


def _proc_fields(pid: int) -> list[str]:
    """Linux: the fields of ``/proc/PID/stat`` after the command name (which may hold anything); [] if gone."""
    try:
        with open(f"/proc/{int(pid)}/stat", encoding="ascii", errors="replace") as f:
            return f.read().rsplit(") ", 1)[-1].split()
    except OSError:
        return []


def _proc_start(pid: int) -> Optional[str]:
    """Linux: the start time field of ``/proc/PID/stat``."""
    fields = _proc_fields(pid)
    return fields[19] if len(fields) > 19 else None


def _ps_state(pid: int) -> str:
    """Elsewhere: ``ps``'s state letters of ``pid`` ("" when there is none)."""
    try:
        return subprocess.run(["ps", "-o", "stat=", "-p", str(int(pid))], capture_output=True, text=True,
                              timeout=10).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return ""


def _ps_start(pid: int) -> Optional[str]:
    """Elsewhere: ``ps``'s start time of ``pid``, spaces squeezed as the shell's ``tr -s ' '`` does (in
    the C locale and UTC on both sides: the watchdogs run with another environment than the notebook)."""
    try:
        out = subprocess.run(["ps", "-o", "lstart=", "-p", str(int(pid))], capture_output=True, text=True,
                             timeout=10, env={**os.environ, "LC_ALL": "C", "TZ": "UTC"}).stdout
    except (OSError, subprocess.SubprocessError):
        return None
    token = " ".join(out.split())
    return token or None


def start_token(pid: int) -> Optional[str]:
    """When process ``pid`` started, as an opaque token (equal tokens: the same process); None when
    there is no process ``pid`` (or it cannot be told)."""
    if pid <= 0:
        return None
    return _proc_start(pid) if os.path.exists("/proc/self/stat") else _ps_start(pid)


def same_process(pid: int, token: Optional[str]) -> bool:
    """Whether ``pid`` still names the process whose start was ``token`` (a zombie counts: its pid is
    not free); False for a pid that is gone or was reused, and when ``token`` is unknown."""
    return bool(token) and start_token(pid) == token


def running(pid: int) -> bool:
    """Whether process ``pid`` exists and has not ended: a zombie (ended, not yet reaped by its parent,
    which an orphan's init may take its time to do) is not running."""
    if pid <= 0:
        return False
    if os.path.exists("/proc/self/stat"):
        fields = _proc_fields(pid)
        return bool(fields) and fields[0] != "Z"
    state = _ps_state(pid)
    return bool(state) and not state.startswith("Z")
