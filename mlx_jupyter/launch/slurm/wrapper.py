"""The task wrapper srun runs on every rank (pure: text and env out).

srun gives every task the same environment, so what differs per rank is
derived on the node from Slurm's own variables: ``MLX_RANK`` from
``SLURM_PROCID``, ``CUDA_VISIBLE_DEVICES`` from ``SLURM_LOCALID`` (unless Slurm
bound GPUs itself). File payloads (the ring hostfile) travel as variables; on
the node each becomes a file removed at once and read through an open
descriptor (``/proc/self/fd/N``, Linux), or a file in a temp dir removed when
the rank ends (elsewhere). Nothing secret is in srun's argv: the values, and
the wrapper itself, come from the environment srun exports.

The wrapper checks that Slurm placed the rank on the node the plan put it on,
reports ``MARKER-start STEP PID`` and ``MARKER-exit CODE`` on stderr (read back
by :mod:`.output`), and runs the command in the foreground, in the task's
process group, so that Slurm's signals reach it directly (the wrapper ignores
them and stays to clean up and report; SIGUSR1 too, which asks a rank started
with ``--where-on-signal`` where it is).
"""

from __future__ import annotations

from functools import cache
from pathlib import Path
from typing import Mapping, Optional, Sequence

from mlx_jupyter.net.ssh import check_name

#: Prefix of the wrapper's lines on stderr.
MARKER = "\x1emlx-jupyter"
#: Exit code of the wrapper when it could not start the command.
SETUP_FAILED = 125

#: The wrapper's control variables (removed before the command runs).
NODES_VAR = "MLX_JUPYTER_SLURM_NODES"      # the planned node of each rank, space-separated
RANK_VAR = "MLX_JUPYTER_SLURM_RANK"        # "1": export MLX_RANK=$SLURM_PROCID
GPU_VAR = "MLX_JUPYTER_SLURM_GPU"          # "1": CUDA_VISIBLE_DEVICES=$SLURM_LOCALID unless Slurm bound GPUs
FILES_VAR = "MLX_JUPYTER_SLURM_FILES"      # names of variables to set to a file holding ..._FILE_<NAME>
FILE_PREFIX = "MLX_JUPYTER_SLURM_FILE_"
SCRIPT_VAR = "MLX_JUPYTER_SLURM_WRAPPER"  # the wrapper itself (argv stays short and readable in ps)
FRAME_VAR = "MLX_JUPYTER_SLURM_FRAME"      # the Python that runs the framer (.framer) around the command
FRAMER_VAR = "MLX_JUPYTER_SLURM_FRAMER"    # the framer's source
CONTROL_VARS = (NODES_VAR, RANK_VAR, GPU_VAR, FILES_VAR, SCRIPT_VAR, FRAME_VAR, FRAMER_VAR)


WRAPPER = r"""umask 077
set -f
M=$(printf '\036mlx-jupyter')
r=${SLURM_PROCID:-?}
n=${SLURMD_NODENAME:-$(hostname)}
die() { printf 'mlx-jupyter: rank %s on %s: %s\n' "$r" "$n" "$1" >&2; printf '%s-exit %s\n' "$M" 125 >&2; exit 125; }
nth() { i=$1; shift; [ "$#" -gt "$i" ] || return 0; shift "$i"; printf '%s' "$1"; }
case $r in ''|*[!0-9]*) die "SLURM_PROCID is not set: run this under srun" ;; esac
want=$(nth "$r" $MLX_JUPYTER_SLURM_NODES)
[ -z "$want" ] && die "no planned node for this rank (the step has more tasks than the plan)"
[ "$want" = "$n" ] || die "Slurm placed it on $n, the plan on $want (options such as --distribution or --nodelist in --slurm-arg change the placement)"
[ "${MLX_JUPYTER_SLURM_RANK:-}" = 1 ] && { MLX_RANK=$r; export MLX_RANK; }
if [ "${MLX_JUPYTER_SLURM_GPU:-}" = 1 ] && [ -z "${SLURM_STEP_GPUS:-}" ] && [ -z "${SLURM_JOB_GPUS:-}" ]; then
  CUDA_VISIBLE_DEVICES=${SLURM_LOCALID:-0}; export CUDA_VISIBLE_DEVICES
fi
d=
trap '[ -n "$d" ] && rm -rf "$d"' EXIT
trap : INT TERM HUP USR1
fd=9
for v in ${MLX_JUPYTER_SLURM_FILES:-}; do
  f=$(mktemp "${TMPDIR:-/tmp}/mlx-jupyter.XXXXXX") || die "cannot create a temp file in ${TMPDIR:-/tmp}"
  eval "printf '%s' \"\${MLX_JUPYTER_SLURM_FILE_$v}\"" >"$f" || { rm -f "$f"; die "cannot write the $v file"; }
  if [ -d /proc/self/fd ] && [ "$fd" -gt 2 ]; then
    # Linux: the file is removed at once and read through its open descriptor, so even a
    # rank killed by SIGKILL (Slurm's last word) leaves nothing behind
    eval "exec $fd<\"\$f\"" && rm -f "$f" && eval "$v=/proc/self/fd/$fd" && fd=$((fd - 1))
  else
    [ -n "$d" ] || d=$(mktemp -d "${TMPDIR:-/tmp}/mlx-jupyter.XXXXXX") || die "cannot create a temp dir"
    mv "$f" "$d/$v" && eval "$v=\$d/\$v"
  fi
  eval "export $v; unset MLX_JUPYTER_SLURM_FILE_$v"
done
fp=${MLX_JUPYTER_SLURM_FRAME:-}
fs=${MLX_JUPYTER_SLURM_FRAMER:-}
unset MLX_JUPYTER_SLURM_NODES MLX_JUPYTER_SLURM_RANK MLX_JUPYTER_SLURM_GPU MLX_JUPYTER_SLURM_FILES MLX_JUPYTER_SLURM_WRAPPER
unset MLX_JUPYTER_SLURM_FRAME MLX_JUPYTER_SLURM_FRAMER
printf '%s-start %s %s\n' "$M" "${SLURM_STEP_ID:-?}" "$$" >&2
if [ -n "$fp" ] && [ -n "$fs" ] && command -v "$fp" >/dev/null 2>&1; then
  # the output in framed pieces as it comes (slurmstepd would hold a line until its newline)
  "$fp" -c "$fs" "$@"
else
  "$@"
fi
rc=$?
printf '%s-exit %s\n' "$M" "$rc" >&2
exit "$rc"
"""


def wrapper_argv(command: Sequence[str]) -> list[str]:
    """What srun runs: ``/bin/sh -c 'eval "$MLX_JUPYTER_SLURM_WRAPPER"' mlx-jupyter-rank command...``."""
    return ["/bin/sh", "-c", f'eval "${SCRIPT_VAR}"', "mlx-jupyter-rank", *command]


def control_env(nodes: Sequence[str], *, set_rank: bool, set_gpu: bool,
                files: Mapping[str, str], frame_with: Optional[str] = None) -> dict[str, str]:
    """The wrapper's control variables for these per-rank ``nodes`` and file payloads; ``frame_with``: the
    Python that relays the command's output in pieces (none there, or None: whole lines, as srun does)."""
    env = {SCRIPT_VAR: WRAPPER, NODES_VAR: " ".join(nodes)}
    if frame_with:
        env.update({FRAME_VAR: frame_with, FRAMER_VAR: framer_source()})
    if set_rank:
        env[RANK_VAR] = "1"
    if set_gpu:
        env[GPU_VAR] = "1"
    if files:
        env[FILES_VAR] = " ".join(check_name(name) for name in files)
        env.update({FILE_PREFIX + name: content for name, content in files.items()})
    return env


@cache
def framer_source() -> str:
    """The framer's text (:mod:`.framer`), run on the node as ``python -c`` (it imports nothing of ours)."""
    return Path(__file__).with_name("framer.py").read_text(encoding="utf-8")
