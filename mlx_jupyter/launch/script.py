"""The POSIX shell scripts run on a remote host (pure: text out).

``rank_script`` starts one rank: it writes the rank's file payloads to a
private temp dir, exports the env, changes directory, starts the command in
its own session (so the whole process group can be signalled by its id),
registers that id with the connection's watchdog, reports it on stdout as a
marker line, waits, kills any leftovers of the group and removes the temp dir.

``REMOTE_WATCHDOG_SCRIPT`` runs once per ssh connection; see its comment.
"""

from __future__ import annotations

from typing import Mapping, Sequence

from mlx_jupyter.net.ssh import check_name, export, join, quote

#: First stdout line of a rank: MARKER + " " + pid (= its process group id).
MARKER = "\x1emlx-jupyter-pid"
#: Exit code of the wrapper when it could not start the command.
SETUP_FAILED = 125

# Start "$@" in a new session and print the new pid first. setsid(1) is
# util-linux (Linux); macOS has none, so fall back to perl's setpgrp.
_SPAWN = r"""
if command -v setsid >/dev/null 2>&1; then
  setsid /bin/sh -c 'printf "%s %s\n" "$0" "$$"; exec "$@"' "$MARKER" "$@" <&3 3<&- &
else
  perl -e 'setpgrp(0, 0); printf("%s %d\n", shift(@ARGV), $$); $|=1; exec { $ARGV[0] } @ARGV or die "exec $ARGV[0]: $!\n"' "$MARKER" "$@" <&3 3<&- &
fi
pid=$!
exec 3<&-
if [ -n "$GUARD" ] && ! printf '%s\n' "$d" 2>/dev/null >"$GUARD/$pid"; then
  kill -s KILL -- "-$pid" "$pid" 2>/dev/null   # the watchdog is gone, so is the launcher: don't run unguarded
  die "the launcher's watchdog on this host is gone"
fi
while :; do
  wait "$pid"; rc=$?
  kill -0 "$pid" 2>/dev/null || break
done
kill -s KILL -- "-$pid" 2>/dev/null
[ -n "$GUARD" ] && rm -f "$GUARD/$pid"
exit "$rc"
"""

# The watchdog: one per ssh connection, so that no rank outlives its launcher.
# It creates a registry dir (each rank wrapper writes a file named after its
# process group id, holding its temp dir), prints it, then blocks in `read` on
# the session's stdin: no CPU, no timer. Each line the launcher writes there is
# "SIGNAME -PGID..." and is delivered with kill(1) (no ssh session per signal).
# stdin reaches EOF when the launcher closes it (normal end) or when sshd drops
# the session because the connection died: the launcher was killed (its kernel
# closes the socket at once) or the network went away (sshd learns of it once
# packets flow again, from the launcher's retransmitted FIN/RST, or from its
# own ClientAliveInterval if set). Then every registered group is SIGKILLed and
# the temp dirs removed. sshd sends no SIGHUP to a session without a tty, but a
# HUP is ignored anyway so that the cleanup always runs. Plain POSIX sh.
REMOTE_WATCHDOG_SCRIPT = r"""umask 077
trap '' HUP PIPE
G=$(mktemp -d "${TMPDIR:-/tmp}/mlx-jupyter.XXXXXX") || { echo "cannot create a temp dir in ${TMPDIR:-/tmp}" >&2; exit 125; }
printf '%s %s\n' "$MARKER" "$G"
while read -r sig groups; do
  kill -s "$sig" -- $groups 2>/dev/null
done
for f in "$G"/*; do
  [ -f "$f" ] || continue
  kill -s KILL -- "-${f##*/}" "${f##*/}" 2>/dev/null   # the pid too: it may not have called setsid yet
  IFS= read -r dir <"$f" && case $dir in "${TMPDIR:-/tmp}"/mlx-jupyter.*) rm -rf "$dir" ;; esac
done
rm -rf "$G"
"""


def rank_script(
    argv: Sequence[str],
    env: Mapping[str, str],
    files: Mapping[str, str],
    cwd: str | None,
    cwd_required: bool,
    label: str,
    guard: str | None = None,
) -> str:
    """Script for one rank; ``label`` (e.g. "rank 2 on h3") prefixes its error messages.

    ``guard`` is the watchdog's registry dir on that host (None: unwatched).
    """
    if not argv:
        raise ValueError("empty command")
    fail = f"{{ printf 'mlx-jupyter: %s: %s\\n' {quote(label)} \"$1\" >&2; exit {SETUP_FAILED}; }}"
    lines = [
        "umask 077",
        f"die() {fail}",
        f"MARKER={quote(MARKER)}",
        f"GUARD={quote(guard or '')}",
        'd=$(mktemp -d "${TMPDIR:-/tmp}/mlx-jupyter.XXXXXX") || die "cannot create a temp dir in ${TMPDIR:-/tmp}"',
        "pid=",
        "trap 'rm -rf \"$d\"' EXIT",
        # Where sshd delivers signals (non-root logins), pass them to the group.
        "trap '[ -n \"$pid\" ] && kill -s TERM -- \"-$pid\" 2>/dev/null' HUP TERM",
        "trap '[ -n \"$pid\" ] && kill -s INT -- \"-$pid\" 2>/dev/null' INT",
    ]
    for i, (name, content) in enumerate(files.items()):
        path = f'"$d"/{quote(f"{i}-{name}")}'
        lines.append(f"printf '%s' {quote(content)} >{path} || die {quote(f'cannot write {name} file')}")
        lines.append(f'{check_name(name)}="$d"/{quote(f"{i}-{name}")}; export {name}')
    lines += [export(k, v) for k, v in env.items()]
    if cwd is not None:
        if cwd_required:
            lines.append(f"cd {quote(cwd)} || die {quote(f'cannot change directory to {cwd}')}")
        else:
            lines.append(f"cd {quote(cwd)} 2>/dev/null || :")
    lines.append(f"set -- {join(argv)}")
    lines.append("exec 3<&0")
    return "\n".join(lines) + _SPAWN


def watchdog_script() -> str:
    """The per-connection watchdog (see ``REMOTE_WATCHDOG_SCRIPT``)."""
    return f"MARKER={quote(MARKER)}\n" + REMOTE_WATCHDOG_SCRIPT
