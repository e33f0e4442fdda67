"""The POSIX shell scripts run on a remote host (pure: text out).

``rank_script`` starts one rank: it reads its settings (env values, file
payloads) from stdin, writes the files to a private temp dir, exports the env,
changes directory, starts the command in its own session (so the whole process
group can be signalled by its id), registers that id with the connection's
watchdog, reports it on stdout as a marker line, waits, kills any leftovers of
the group and removes the temp dir.

Settings never go into the script itself: the script is the argv of a shell
that lives as long as the rank, and any user on the host can read a process's
argv (``/proc/PID/cmdline``, ``ps``). Env values carry secrets (the job token,
ipyparallel's connection key, ``--env`` values).

``REMOTE_WATCHDOG_SCRIPT`` runs once per ssh connection; see its comment.
"""

from __future__ import annotations

from typing import Mapping, NamedTuple, Sequence

from mlx_jupyter.net.ssh import check_name, export, join, quote
from mlx_jupyter.proc_identity import SHELL_START_TOKEN

#: First stdout line of a rank: MARKER + " " + pid (= its process group id).
MARKER = "\x1emlx-jupyter-pid"
#: Exit code of the wrapper when it could not start the command.
SETUP_FAILED = 125

# Start "$@" in a new session and print the new pid first. An asynchronous list of a shell without job
# control starts with SIGINT and SIGQUIT ignored, and a shell cannot undo that, so perl (in macOS and
# Debian's perl-base) starts the rank: it resets both to their defaults (Ctrl-C forwarded by the launcher
# must raise KeyboardInterrupt as it does locally) and, for a rank that will answer where-signals
# (_mj_hold_usr1 set), ignores SIGUSR1 until the rank's boot code takes it over: a SIGUSR1 in its first
# milliseconds would otherwise end it. Without perl, setsid(1) (util-linux), with those limits.
_SPAWN = r"""
if command -v perl >/dev/null 2>&1; then
  perl -e '
    eval { require POSIX; POSIX::setsid() } or setpgrp(0, 0);
    $SIG{INT} = $SIG{QUIT} = "DEFAULT";
    my $marker = shift(@ARGV);
    $SIG{USR1} = "IGNORE" if shift(@ARGV);
    $| = 1;
    printf("%s %d\n", $marker, $$);
    exec { $ARGV[0] } @ARGV;
    print STDERR "$ARGV[0]: $!\n";
    exit($!{ENOENT} ? 127 : 126);
  ' "$_mj_marker" "$_mj_hold_usr1" "$@" <&3 3<&- &
else
  setsid /bin/sh -c 'printf "%s %s\n" "$0" "$$"; exec "$@"' "$_mj_marker" "$@" <&3 3<&- &
fi
_mj_pid=$!
exec 3<&-
if [ -n "$_mj_guard" ] && ! printf '%s\n%s\n' "$_mj_d" "$(start_token "$_mj_pid")" 2>/dev/null >"$_mj_guard/$_mj_pid"; then
  kill -s KILL -- "-$_mj_pid" "$_mj_pid" 2>/dev/null   # the watchdog is gone, so is the launcher: don't run unguarded
  die "the launcher's watchdog on this host is gone"
fi
while :; do
  wait "$_mj_pid"; _mj_rc=$?
  kill -0 "$_mj_pid" 2>/dev/null || break
done
[ -n "$(start_token "$_mj_pid")" ] || kill -s KILL -- "-$_mj_pid" 2>/dev/null   # reaped: a pid in use is another's
[ -n "$_mj_guard" ] && rm -f "$_mj_guard/$_mj_pid"
exit "$_mj_rc"
"""

# The watchdog: one per ssh connection, so that no rank outlives its launcher.
# It creates a registry dir (each rank wrapper writes a file named after its
# process group id, holding its temp dir), prints it, then blocks in `read` on
# the session's stdin: no CPU, no timer. Each line the launcher writes there is
# "SIGNAME -PGID..." and is delivered with kill(1) (no ssh session per signal),
# except to a registered rank whose pid no longer has the start recorded.
# stdin reaches EOF when the launcher closes it (normal end) or when sshd drops
# the session because the connection died: the launcher was killed (its kernel
# closes the socket at once) or the network went away (sshd learns of it once
# packets flow again, from the launcher's retransmitted FIN/RST, or from its
# own ClientAliveInterval if set). Then every registered group is SIGKILLed and
# the temp dirs removed: only while its pid still names the rank registered (the
# file's second line is the rank's start, proc_identity's token; a pid reused
# since is left alone). sshd sends no SIGHUP to a session without a tty, but a
# HUP is ignored anyway so that the cleanup always runs. Plain POSIX sh.
REMOTE_WATCHDOG_SCRIPT = r"""umask 077
trap '' HUP PIPE
""" + SHELL_START_TOKEN + r"""
G=$(mktemp -d "${TMPDIR:-/tmp}/mlx-jupyter.XXXXXX") || { echo "cannot create a temp dir in ${TMPDIR:-/tmp}" >&2; exit 125; }
printf '%s %s\n' "$MARKER" "$G"
while read -r sig groups; do
  for g in $groups; do
    f=$G/${g#-} tok=
    [ -f "$f" ] && { IFS= read -r _ && IFS= read -r tok; } <"$f"
    [ -n "$tok" ] && [ "$(start_token "${g#-}")" != "$tok" ] && continue   # its pid names another process now
    kill -s "$sig" -- "$g" 2>/dev/null
  done
done
for f in "$G"/*; do
  [ -f "$f" ] || continue
  dir= tok=
  { IFS= read -r dir; IFS= read -r tok; } <"$f"
  if [ -n "$tok" ] && [ "$(start_token "${f##*/}")" = "$tok" ]; then
    kill -s KILL -- "-${f##*/}" "${f##*/}" 2>/dev/null   # the pid too: it may not have called setsid yet
  fi
  case $dir in "${TMPDIR:-/tmp}"/mlx-jupyter.*) rm -rf "$dir" ;; esac
done
rm -rf "$G"
"""


# Read the settings from stdin: a line count, then that many lines of shell
# (quoted exports and file writes), evaluated without ever being in argv or on
# disk. `read` takes one byte at a time from a pipe, so whatever follows is
# left for the rank's own stdin.
_READ_SETTINGS = r"""
IFS= read -r _mj_n || die "its settings did not arrive on stdin"
case $_mj_n in ''|*[!0-9]*) die "its settings are garbled" ;; esac
_mj_s=
while [ "$_mj_n" -gt 0 ]; do
  IFS= read -r _mj_l || die "its settings were cut short"
  _mj_s="$_mj_s$_mj_l
"
  _mj_n=$((_mj_n - 1))
done
eval "$_mj_s" || die "its settings could not be applied"
unset _mj_s _mj_l _mj_n
"""


#: Prefix of the rank script's own variables (an env var of the same name would overwrite them).
_OWN = "_mj_"


class RankStart(NamedTuple):
    """How to start one rank: ``script`` (the shell's argv: no secrets) and ``setup`` (its stdin's first lines)."""

    script: str
    setup: str


def _settings(env: Mapping[str, str], files: Mapping[str, str]) -> str:
    """The settings as shell lines, prefixed with their count (see ``_READ_SETTINGS``)."""
    taken = [n for n in [*files, *env] if n.startswith(_OWN)]
    if taken:
        raise ValueError(f"environment variable {taken[0]!r}: names starting with {_OWN} are the rank script's own")
    lines = []
    for i, (name, content) in enumerate(files.items()):
        path = f'"$_mj_d"/{quote(f"{i}-{check_name(name)}")}'
        lines.append(f"printf '%s' {quote(content)} >{path} || die {quote(f'cannot write {name} file')}")
        lines.append(f"{name}={path}; export {name}")
    lines += [export(k, v) for k, v in env.items()]
    text = "".join(line + "\n" for line in lines)
    return f"{text.count(chr(10))}\n{text}"


def rank_script(
    argv: Sequence[str],
    env: Mapping[str, str],
    files: Mapping[str, str],
    cwd: str | None,
    cwd_required: bool,
    label: str,
    guard: str | None = None,
    hold_usr1: bool = False,
) -> RankStart:
    """Script and stdin setup for one rank; ``label`` (e.g. "rank 2 on h3") prefixes its error messages.

    ``guard`` is the watchdog's registry dir on that host (None: unwatched). ``hold_usr1``: the
    command answers SIGUSR1 once started (``--where-on-signal``): ignore it until then.
    Write ``setup`` to the session's stdin first; the rank's own stdin follows.
    """
    if not argv:
        raise ValueError("empty command")
    fail = f"{{ printf 'mlx-jupyter: %s: %s\\n' {quote(label)} \"$1\" >&2; exit {SETUP_FAILED}; }}"
    lines = [
        "umask 077",
        f"die() {fail}",
        f"_mj_marker={quote(MARKER)}",
        f"_mj_guard={quote(guard or '')}",
        f"_mj_hold_usr1={'1' if hold_usr1 else ''}",
        '_mj_d=$(mktemp -d "${TMPDIR:-/tmp}/mlx-jupyter.XXXXXX") || die "cannot create a temp dir in ${TMPDIR:-/tmp}"',
        "_mj_pid=",
        SHELL_START_TOKEN,
        "trap 'rm -rf \"$_mj_d\"' EXIT",
        # Where sshd delivers signals (non-root logins), pass them to the group.
        "trap '[ -n \"$_mj_pid\" ] && kill -s TERM -- \"-$_mj_pid\" 2>/dev/null' HUP TERM",
        "trap '[ -n \"$_mj_pid\" ] && kill -s INT -- \"-$_mj_pid\" 2>/dev/null' INT",
    ]
    setup = _settings(env, files)
    lines.append(_READ_SETTINGS.strip())
    if cwd is not None:
        if cwd_required:
            lines.append(f"cd {quote(cwd)} || die {quote(f'cannot change directory to {cwd}')}")
        else:
            lines.append(f"cd {quote(cwd)} 2>/dev/null || :")
    lines.append(f"set -- {join(argv)}")
    lines.append("exec 3<&0")
    return RankStart("\n".join(lines) + _SPAWN, setup)


def watchdog_script(check: str = "") -> str:
    """The per-connection watchdog (see ``REMOTE_WATCHDOG_SCRIPT``); ``check``: shell lines run in the
    background once its dir is made (``remote_check.probe_script``: can this host run the backend?)."""
    ready = "printf '%s %s\\n' \"$MARKER\" \"$G\"\n"
    assert ready in REMOTE_WATCHDOG_SCRIPT
    return f"MARKER={quote(MARKER)}\n" + REMOTE_WATCHDOG_SCRIPT.replace(ready, ready + check)
