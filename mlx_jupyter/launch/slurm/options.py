"""What ``--slurm`` asks for (:class:`SlurmOptions`) and the sbatch/srun command lines it becomes (pure)."""

from __future__ import annotations

import shlex
from dataclasses import dataclass, field
from typing import Callable, Mapping, Optional, Sequence

from mlx_jupyter.launch.slurm.parse import JobState

#: The allocation's batch script: hold the nodes until we scancel the job (our steps come from srun).
HOLD_SCRIPT = "exec sleep 2147483647"
#: The steps' name, unless the user names the job.
NAME_PREFIX = "mlx-jupyter-"


class SlurmOptionsError(ValueError):
    """An option cannot be turned into a Slurm command line; the message names it."""


@dataclass
class SlurmOptions:
    """A launch under Slurm: where the ranks go and what allocation to ask for.

    Inside an allocation (``SLURM_JOB_ID`` set) the ranks start there with srun
    (``nodes``: its first N nodes, default all); otherwise an allocation of
    ``nodes`` nodes (default 1) is requested with sbatch, held for the launch
    and cancelled after it. ``args``: more sbatch options when we allocate,
    more srun options inside an existing allocation; ``srun_args``: more srun
    options in both cases (``--mpi=pmix``, ``--gpus-per-task=1``). Each item is
    split like a shell would (``"--gres=gpu:4 --constraint=a100"``).
    """

    nodes: Optional[int] = None
    ranks_per_node: int = 1
    partition: Optional[str] = None
    time: Optional[str] = None
    account: Optional[str] = None
    args: list[str] = field(default_factory=list)
    srun_args: list[str] = field(default_factory=list)   # more srun options, always
    job_name: Optional[str] = None
    #: None: use the current allocation when SLURM_JOB_ID is set; True: always ask for a new one
    allocate: Optional[bool] = None
    #: run in this job (one held by someone else, e.g. a notebook's cluster): never released here
    job_id: Optional[int] = None
    #: seconds between squeue probes while the job waits for its nodes
    poll_interval: float = 1.0
    #: after a rank fails, seconds srun gets to end the others before we stop the step ourselves
    #: (a node that went silent never reports its tasks' end)
    failure_grace: float = 3.0
    #: called with the job's state each time it changes while waiting (default: a line on stderr)
    on_state: Optional[Callable[[JobState], None]] = None


def split_args(items: Sequence[str], flag: str = "--slurm-arg") -> list[str]:
    """Each item split like a shell would; an error names the item."""
    out: list[str] = []
    for item in items:
        try:
            out += shlex.split(item)
        except ValueError as exc:
            raise SlurmOptionsError(f"{flag} {item!r}: {exc}") from None
    return out


#: sbatch's and srun's short options that take no argument: getopt reads the next letter of a bundle
#: (``-vJname``) as another option; after any other letter the rest of the word is that option's argument
_SHORT_FLAGS = frozenset("HhOQsuVvWlXZE")


def renames_job(word: str) -> bool:
    """Whether one sbatch/srun word sets the job's name: ``-J``, a bundle reaching it (``-vJx``), or
    ``--job-name`` or any prefix getopt_long takes for it (``--jo=x``)."""
    if word.startswith("--"):
        long = word.split("=", 1)[0]
        return len(long) >= 3 and "--job-name".startswith(long)
    if not word.startswith("-"):
        return False
    for letter in word[1:]:
        if letter == "J":
            return True
        if letter not in _SHORT_FLAGS:
            return False
    return False


def refuse_job_name(items: Sequence[str], flag: str = "--slurm-arg") -> None:
    """An error naming the item of ``items`` (sbatch options) that would rename the job (``-J``, ``--job-name``).

    The job's name is ours and unique: a launcher that dies before sbatch answers leaves its
    watchdog only that name to cancel the job by, and a name of the user's would match nothing
    (or cancel the user's other jobs of that name).
    """
    for item in items:
        for word in split_args([item], flag):
            if renames_job(word):
                raise SlurmOptionsError(
                    f"{flag} {item!r}: the job's name is mlx-jupyter's own ({NAME_PREFIX}…, unique), which its "
                    "watchdog cancels the job by if this process dies before sbatch answers; a name of yours "
                    "would match nothing (or your other jobs of that name). Drop -J/--job-name.")


def _check(value: Optional[str], flag: str) -> list[str]:
    if value is None:
        return []
    if not value or any(c.isspace() or c == "\0" for c in value) or value.startswith("-"):
        raise SlurmOptionsError(f"{flag} {value!r}: expected one word, not starting with '-'")
    return [f"{flag}={value}"]


def allocation_argv(opts: SlurmOptions, name: str) -> list[str]:
    """``sbatch --parsable ...`` for an allocation of ``opts.nodes`` nodes held by :data:`HOLD_SCRIPT`.

    ``--no-requeue``: a node failure must end the allocation, not start it again behind our back;
    ``--export=NONE``: the holder needs none of our environment (Slurm would store it).
    """
    nodes = opts.nodes or 1
    refuse_job_name(opts.args)
    return ["sbatch", "--parsable", f"--job-name={name}", f"--nodes={nodes}",
            f"--ntasks-per-node={opts.ranks_per_node}", "--no-requeue", "--export=NONE",
            "--output=/dev/null", "--error=/dev/null",
            *_check(opts.partition, "--partition"), *_check(opts.time, "--time"),
            *_check(opts.account, "--account"), *split_args(opts.args), f"--wrap={HOLD_SCRIPT}"]


def step_argv(job_id: int, nodes: Sequence[str], ranks_per_node: int, *, name: str, stdin: bool,
              kill_on_bad_exit: bool, subset: bool, mpi: Optional[str], in_step: bool,
              extra: Sequence[str] = ()) -> list[str]:
    """``srun ...`` starting ``ranks_per_node`` tasks on each of ``nodes`` in job ``job_id``, rank order = node order.

    ``--label`` tags each line with its task; ``--export=ALL`` passes our environment (the
    contract's variables and the token: never on a command line); ``--overlap`` when we run
    inside a step, which holds the CPUs; ``--mpi=MPI`` (the PMI plugin that starts MPI ranks:
    ``pmix``, ``pmi2``), ``--mpi=none`` without MPI, unless ``extra`` names one.
    """
    argv = ["srun", f"--jobid={job_id}", f"--job-name={name}", f"--nodes={len(nodes)}",
            f"--ntasks={len(nodes) * ranks_per_node}", f"--ntasks-per-node={ranks_per_node}",
            "--distribution=block", "--label", "--export=ALL", f"--input={'all' if stdin else 'none'}",
            f"--kill-on-bad-exit={1 if kill_on_bad_exit else 0}"]
    if subset:
        argv.append(f"--nodelist={','.join(nodes)}")
    if in_step:
        argv.append("--overlap")
    if not any(a == "--mpi" or a.startswith("--mpi=") for a in extra):
        argv.append(f"--mpi={mpi or 'none'}")
    return argv + list(extra)


def inside_allocation(env: Mapping[str, str]) -> Optional[int]:
    """The job id of the allocation this process runs in, if any."""
    text = env.get("SLURM_JOB_ID") or env.get("SLURM_JOBID") or ""
    return int(text) if text.isdigit() and int(text) > 0 else None


def in_step(env: Mapping[str, str]) -> bool:
    """Whether this process runs inside a job step (srun), not the batch script or an salloc shell."""
    step = env.get("SLURM_STEP_ID", "")
    # the batch step reports 4294967294 (or "batch"), the extern step 4294967295
    return step.isdigit() and int(step) < 4294967290
