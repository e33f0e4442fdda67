"""The POSIX shell script that starts one rank on a remote host (pure: text out).

It writes the rank's file payloads to a private temp dir, exports the env,
changes directory, starts the command in its own session (so the launcher can
signal the whole process group by its id), reports that id on stdout as a
marker line, waits, kills any leftovers of the group and removes the temp dir.
"""

from __future__ import annotations

from typing import Mapping, Sequence

from mlx_jupyter.ssh import check_name, export, join, quote

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
while :; do
  wait "$pid"; rc=$?
  kill -0 "$pid" 2>/dev/null || break
done
kill -KILL -- "-$pid" 2>/dev/null
exit "$rc"
"""


def rank_script(
    argv: Sequence[str],
    env: Mapping[str, str],
    files: Mapping[str, str],
    cwd: str | None,
    cwd_required: bool,
    label: str,
) -> str:
    """Script for one rank; ``label`` (e.g. "rank 2 on h3") prefixes its error messages."""
    if not argv:
        raise ValueError("empty command")
    fail = f"{{ printf 'mlx-jupyter: %s: %s\\n' {quote(label)} \"$1\" >&2; exit {SETUP_FAILED}; }}"
    lines = [
        "umask 077",
        f"die() {fail}",
        f"MARKER={quote(MARKER)}",
        'd=$(mktemp -d "${TMPDIR:-/tmp}/mlx-jupyter.XXXXXX") || die "cannot create a temp dir in ${TMPDIR:-/tmp}"',
        "pid=",
        "trap 'rm -rf \"$d\"' EXIT",
        # Where sshd delivers signals (non-root logins), pass them to the group.
        "trap '[ -n \"$pid\" ] && kill -TERM -- \"-$pid\" 2>/dev/null' HUP TERM",
        "trap '[ -n \"$pid\" ] && kill -INT -- \"-$pid\" 2>/dev/null' INT",
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
