"""``mlx-jupyter launch --slurm`` options, and ``--detach``: the launch submitted as a batch job.

A detached launch is a batch script that runs the same launch inside its
allocation (srun from the batch host). Values given with ``--env`` travel in
sbatch's environment (exported to the job), the script names only the keys:
no value is ever on a command line.
"""

from __future__ import annotations

import argparse
import os
import secrets
import shlex
import subprocess
from typing import Mapping, Sequence

from mlx_jupyter.vocab import options
from mlx_jupyter.hostfile import default_ranks_per_host
from mlx_jupyter.launch.slurm.commands import TIMEOUT, SlurmError
from mlx_jupyter.launch.slurm.options import NAME_PREFIX, SlurmOptions, refuse_job_name, split_args
from mlx_jupyter.launch.slurm.parse import SlurmOutputError, parse_job_id

#: Options that only mean something with --slurm.
SLURM_ONLY = ("nodes", "partition", "time", "account", "slurm_arg", "srun_arg", "detach")


def add_arguments(p: argparse.ArgumentParser) -> None:
    """The ``--slurm`` group of ``mlx-jupyter launch``: the spec's (mlx_jupyter.vocab.options), then the launcher's own."""
    g = p.add_argument_group("Slurm", "run the ranks as a Slurm job step (-n: ranks per node)")
    options.add_to_parser(g, options.LAUNCH, group="Slurm")
    g.add_argument("--srun-arg", action="append", default=[], metavar="ARG",
                   help="more srun options, e.g. --srun-arg=--mpi=pmix; repeatable")
    g.add_argument("--detach", action="store_true",
                   help="submit the launch as a batch job, print its id and return (output: slurm-JOBID.out)")


def misused(args: argparse.Namespace) -> list[str]:
    """The Slurm-only options given without --slurm."""
    return [f"--{name.replace('_', '-')}" for name in SLURM_ONLY
            if not args.slurm and getattr(args, name) not in (None, False, [])]


def options_from_args(args: argparse.Namespace) -> SlurmOptions:
    """:class:`SlurmOptions` from the parsed command line (a job-name override is refused here, at once)."""
    if not args.detach:   # a detached launch's batch job is not watched by name
        refuse_job_name(args.slurm_arg)
    return SlurmOptions(nodes=args.nodes, ranks_per_node=args.repeat_hosts or default_ranks_per_host(True), partition=args.partition,
                        time=args.time, account=args.account, args=list(args.slurm_arg),
                        srun_args=list(args.srun_arg))


def batch_script(python: str, launch_args: Sequence[str], command: Sequence[str]) -> str:
    """The batch script of a detached launch: this launch again, inside the allocation."""
    words = [python, "-m", "mlx_jupyter", "launch", "--slurm", *launch_args, "--", *command]
    return "#!/bin/sh\nexec " + " ".join(shlex.quote(w) for w in words) + "\n"


def inner_args(args: argparse.Namespace, env_keys: Sequence[str]) -> list[str]:
    """The options the launch inside the batch job gets (allocation options stay with sbatch)."""
    out = ["-n", str(args.repeat_hosts or default_ranks_per_host(True)), "--python", args.python]
    if args.backend:
        out += ["--backend", args.backend]
    if args.starting_port:
        out += ["--starting-port", str(args.starting_port)]
    out += ["--connections-per-ip", str(args.connections_per_ip), "--nccl-port", str(args.nccl_port)]
    if args.cwd:
        out += ["--cwd", args.cwd]
    if args.output:
        out += ["--output", args.output]
    if args.verbose:
        out.append("--verbose")
    for arg in args.srun_arg:
        out.append(f"--srun-arg={arg}")
    for key in env_keys:   # bare keys: the values come from the job's environment
        out += ["--env", key]
    return out + ["--no-verify-script"]


def submit_detached(args: argparse.Namespace, command: Sequence[str], env: Mapping[str, str]) -> int:
    """sbatch the launch (script on stdin, ``env`` in sbatch's environment); the job id."""
    opts = options_from_args(args)
    sbatch = ["sbatch", "--parsable", f"--job-name={NAME_PREFIX}{secrets.token_hex(4)}", f"--nodes={opts.nodes or 1}",
              f"--ntasks-per-node={opts.ranks_per_node}", "--no-requeue", "--export=ALL"]
    for flag, value in (("--partition", opts.partition), ("--time", opts.time), ("--account", opts.account)):
        if value:
            sbatch.append(f"{flag}={value}")
    sbatch += split_args(opts.args)
    script = batch_script(args.python, inner_args(args, list(env)), command)
    try:
        res = subprocess.run(sbatch, input=script, capture_output=True, text=True, timeout=TIMEOUT,
                             env={**os.environ, **env})
    except FileNotFoundError:
        raise SlurmError("sbatch not found: --detach needs Slurm's client commands (apt-get install slurm-client)") from None
    except subprocess.TimeoutExpired:
        raise SlurmError(f"sbatch did not answer within {TIMEOUT:g} s: is slurmctld reachable (`scontrol ping`)?") from None
    if res.returncode != 0:
        raise SlurmError(f"sbatch failed: {res.stderr.strip() or res.returncode}")
    try:
        return parse_job_id(res.stdout)
    except SlurmOutputError as exc:
        raise SlurmError(str(exc)) from None
