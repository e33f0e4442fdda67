"""Mutation testing of the pure planners and parsers (mutmut 3), one module at a time.

    .venv/bin/python tests/mutation/run.py                 # every module below, ~10-20 min
    .venv/bin/python tests/mutation/run.py vocab/ports.py    # one (paths under mlx_jupyter/)
    .venv/bin/python tests/mutation/run.py --changed origin/main   # those changed since a commit
    .venv/bin/python tests/mutation/run.py --save          # and write benchmarks/results/mutation.txt

Each module gets a scratch copy of the tree under build/mutation/<module>/ (mutmut mutates its own
copy, never this working tree) and runs only the fast unit tests that cover it (MODULES). The
editable install routes ``import mlx_jupyter`` to this checkout, so mutmut runs in a process that
drops that route first and imports the scratch copy instead. Prints the kill rate per module
(killed / (mutants - the equivalent ones listed in EQUIVALENT)) and the survivors' diffs; exits 1
when a module is under --min (90 %).
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SCRATCH = ROOT / "build" / "mutation"
RESULTS = ROOT / "benchmarks" / "results" / "mutation.txt"
EXAMPLES = 40   # Hypothesis examples per property test and mutant

#: module (under mlx_jupyter/) -> the fast unit tests that cover it (no test bed, no kernels)
MODULES: dict[str, list[str]] = {
    "vocab/ports.py": ["tests/net/test_ports.py"],
    "vocab/hosts.py": ["tests/net/test_host_rules.py"],
    "topology/addressing.py": ["tests/topology/test_addressing.py", "tests/topology/test_plan_errors.py",
                               "tests/topology/test_untrusted_names.py"],
    "topology/netparse.py": ["tests/topology/test_netparse_edges.py", "tests/topology/test_topology_parsers.py"],
    "where/model.py": ["tests/where/test_model.py", "tests/where/test_model_words.py"],
    "launch/slurm/parse.py": ["tests/slurm/test_parse.py", "tests/slurm/test_parse_edges.py"],
    "launch/slurm/output.py": ["tests/slurm/test_parse.py", "tests/slurm/test_framing.py"],
    "vocab/binding.py": ["tests/launch/test_binding.py::test_shares_are_disjoint_equal_blocks_of_the_allowed_cpus",
                          "tests/launch/test_binding.py::test_policy_names_the_flag_on_a_bad_value",
                          "tests/launch/test_binding.py::test_shares_by_example",
                          "tests/launch/test_binding.py::test_describe_and_the_cpus_allowed_here",
                          "tests/launch/test_binding.py::test_a_child_spawned_inside_runs_on_the_share_and_the_thread_gets_its_cpus_back"],
    "launch/contract.py": ["tests/launch/test_contract.py", "tests/launch/test_contract_exact.py"],
    "vocab/rank_env.py": ["tests/launch/test_rank_env.py", "tests/launch/test_rank_env_edges.py"],
    "hostfile.py": ["tests/launch/test_hostfile_edges.py", "tests/launch/test_hostfile.py"],
}

#: Mutants judged equivalent (no input can tell them from the original): mutmut's name -> why.
#: A name (module.x_function__mutmut_N) changes when its function changes: then judge it again.
EQUIVALENT: dict[str, str] = {
    "mlx_jupyter.vocab.ports.x__reserve__mutmut_4": "`< RESERVED_FOR_S` to `<=`: equal only if a block is asked for "
    "exactly 600.0 s (float monotonic time) after another",
    "mlx_jupyter.vocab.ports.x_free_port_block__mutmut_2": "200 to 201 tries: only the number of random draws before "
    "giving up (a test cannot see one more)",
    "mlx_jupyter.vocab.ports.x_free_port_block__mutmut_55": "socket(AF_INET) without SOCK_STREAM: SOCK_STREAM is its default",
    "mlx_jupyter.vocab.ports.x_free_port_block__mutmut_32": "core_offset of 0..start+n, not start..start+n: ports below a "
    "block shifted either way are clear whenever the block's are, so the offset is the block's",
    "mlx_jupyter.launch.contract.x__core_ring__mutmut_14": "core_offset of 0..start+count, not start..start+count: ports "
    "below a block shifted either way are clear whenever the block's are, so the offset is the block's",
    **{f"mlx_jupyter.topology.netparse.x_parse_ibv_devices__mutmut_{n}": "ibv_devices' header and rule lines "
       "(device, ------): a mutant that stops skipping one keeps it as a device name, which the result drops anyway "
       "as it does not start with rdma_" for n in (31, 36, 37, 38, 41, 42)},
    "mlx_jupyter.launch.contract.x_nccl_timeout_ms__mutmut_12": "`>= _NCCL_WAIT_MS` to `>`: at equality both give "
    "str(_NCCL_WAIT_MS)",
    "mlx_jupyter.vocab.rank_env.x__process_rank__mutmut_9": "default None instead of 0, then `or 0`: the same 0",
    "mlx_jupyter.vocab.rank_env.x__mpi_size__mutmut_13": "a garbled MPI size read as 3, not 2: only `> 1` is asked",
    "mlx_jupyter.vocab.rank_env.x__mpi_size__mutmut_14": "no MPI size read as 1, not 0: only `> 1` is asked",
    "mlx_jupyter.vocab.rank_env.x_read__mutmut_13": "cell port default None instead of 0: `cell_port or None` either way",
    "mlx_jupyter.vocab.rank_env.x_variables__mutmut_12": "`unknown < known` for `<=`: the unknown names never include "
    "the written ones, which are RankEnv fields, so they are never all of them",
    **{f"mlx_jupyter.vocab.rank_env.x__read_text__mutmut_{n}": "the hostfile's encoding utf-8 to the locale's "
       "(UTF-8 here) or UTF-8: the same codec" for n in (2, 4, 6)},
    **{f"mlx_jupyter.launch.slurm.parse.x_parse_job_id__mutmut_{n}": "split(';') with no or a larger limit: "
       "its first part is the same" for n in (5, 8)},
    **{f"mlx_jupyter.launch.slurm.parse.x_parse_squeue_line__mutmut_{n}": "how the line's end is stripped before "
       "splitting on '|': every field is stripped after anyway" for n in (7, 8, 9)},
    "mlx_jupyter.vocab.binding.x_allowed_cpus__mutmut_10": "sched_getaffinity of pid 1 instead of this process: "
    "the same CPUs in this container (a test cannot narrow its own without also narrowing what it compares)",
    "mlx_jupyter.vocab.binding.x_plan__mutmut_7": "`if cpus` always true: allowed_cpus is None only where the OS has "
    "no CPU binding (macOS), and never empty on Linux",
    "mlx_jupyter.vocab.rank_env.x_read__mutmut_178": "size default None instead of 1, then `or 1`: the same 1",
    "mlx_jupyter.vocab.rank_env.x_read__mutmut_191": "size `or 2` for `or 1`: _int gives 1..2**20 or its default 1, "
    "never 0, so the `or` never applies",
    "mlx_jupyter.vocab.hosts.x_split_addr__mutmut_39": "'' to 'XXXX' as the inner text of half-bracketed hosts: "
    "neither has ':', so both are refused the same way",
}

#: Lines that run only on another OS (here: macOS's and BSD's): their mutants are listed apart and not
#: counted, as no test on this machine can run them. module -> [(text of the original line, why)].
OTHER_OS: dict[str, list[tuple[str, str]]] = {} if sys.platform == "darwin" else {
    "vocab/ports.py": [(s, "macOS/BSD: the ephemeral range from sysctl") for s in (
        'if sys.platform == "darwin" or "bsd" in sys.platform:', '"sysctl", "-n", "net.inet.ip.portrange.first"',
        "capture_output=True, text=True, timeout=2).stdout.split()", "return int(out[0]), int(out[1])")],
}

#: Run in the mutmut process before its CLI: forget the editable install's import route to this
#: checkout (a meta-path finder and the checkout on sys.path) so the scratch copy is what tests import.
_LAUNCH = """
import sys
root = sys.argv.pop(1)
sys.meta_path[:] = [f for f in sys.meta_path if 'skbc' not in type(f).__module__.lower() and 'editable' not in type(f).__module__.lower()]
sys.path[:] = [p for p in sys.path if p.rstrip('/') != root]
if sys.argv[1:] == ["show-all"]:   # every named mutant's diff in one process (names on stdin)
    from mutmut.__main__ import find_mutant, get_diff_for_mutant
    for name in sys.stdin.read().split():
        print("@@@MUTANT " + name + chr(10) + get_diff_for_mutant(name, path=find_mutant(name).path))
    sys.exit(0)
from mutmut.__main__ import cli
cli()
"""


def _mutmut(scratch: Path, *args: str, check: bool = True, stdin: str = "") -> str:
    env = {k: v for k, v in os.environ.items() if not k.startswith("MUTANT")}
    env["PYTHONDONTWRITEBYTECODE"] = "1"
    done = subprocess.run(["nice", "-n", "10", sys.executable, "-c", _LAUNCH, str(ROOT), *args], cwd=scratch,
                          env=env, capture_output=True, text=True, timeout=3600, input=stdin)
    if check and done.returncode != 0:
        raise SystemExit(f"mutmut {' '.join(args)} failed in {scratch} (exit {done.returncode}):\n"
                         f"{done.stdout[-4000:]}\n{done.stderr[-4000:]}")
    return done.stdout


def _prepare(module: str, tests: list[str]) -> Path:
    scratch = SCRATCH / module.replace("/", "_").removesuffix(".py")
    shutil.rmtree(scratch, ignore_errors=True)
    scratch.mkdir(parents=True)
    skip = shutil.ignore_patterns("__pycache__", "*.so", "node_modules", ".hypothesis", "*.pyc")
    shutil.copytree(ROOT / "mlx_jupyter", scratch / "mlx_jupyter", ignore=skip)
    shutil.copytree(ROOT / "tests", scratch / "tests", ignore=skip)
    # Property tests: the same examples for every mutant (derandomized), no deadline (a loaded machine
    # must not pass for a kill), and at most EXAMPLES each (they run once per mutant): in the scratch
    # copy only, a module's own profile or @settings asks for no more.
    with open(scratch / "tests" / "conftest.py", "a") as fh:
        fh.write("\n\nfrom hypothesis import settings as _s  # noqa: E402  (tests/mutation/run.py)\n"
                 f"_s.register_profile('mutation', max_examples={EXAMPLES}, deadline=None, derandomize=True,"
                 " database=None)\n_s.load_profile('mutation')\n")
    for test in (scratch / "tests").rglob("*.py"):
        text = test.read_text()
        capped = re.sub(r"max_examples=(\d+)", lambda m: f"max_examples={min(int(m.group(1)), EXAMPLES)}", text)
        if capped != text:
            test.write_text(capped)
    quoted = ", ".join(f'"{t}"' for t in tests)
    (scratch / "pyproject.toml").write_text(
        "[tool.mutmut]\n"
        'source_paths = ["mlx_jupyter"]\n'
        f'only_mutate = ["mlx_jupyter/{module}"]\n'
        f"pytest_add_cli_args_test_selection = [{quoted}]\n"
        'pytest_add_cli_args = ["-p", "no:cacheprovider", "-p", "no:timeout"]\n'
        "use_setproctitle = false\n"
        "[tool.pytest.ini_options]\n"
        'testpaths = ["tests"]\n'
        'markers = ["slow: long scenarios"]\n')
    return scratch


def run_module(module: str, jobs: int, again: bool = True) -> dict:
    """Mutate one module (or, with ``again`` False, read its last run); returns its counts and the
    survivors (name -> diff)."""
    scratch = SCRATCH / module.replace("/", "_").removesuffix(".py")
    if again or not (scratch / "mutants").is_dir():
        _prepare(module, MODULES[module])
        _mutmut(scratch, "run", "--max-children", str(jobs))
    status: dict[str, str] = {}
    for line in _mutmut(scratch, "results", "--all", "true").splitlines():
        m = re.match(r"\s+(\S+): (.+)$", line)
        if m:
            status[m.group(1)] = m.group(2).strip()
    # a timeout is a kill: the tests did not pass with the mutant (it looped)
    killed = {name for name, s in status.items() if s in ("killed", "timeout")}
    equivalent = sorted(name for name in status if name in EQUIVALENT)
    left = [name for name in sorted(status) if name not in killed and name not in EQUIVALENT]
    shown = _mutmut(scratch, "show-all", stdin="\n".join(left)).split("@@@MUTANT ")[1:] if left else []
    diffs = {text.split("\n", 1)[0]: f"# {text.split(chr(10), 1)[0]}: {status[text.split(chr(10), 1)[0]]}\n"
             + text.split("\n", 1)[1] for text in shown}
    other_os = sorted(name for name, diff in diffs.items() if _other_os(module, diff))
    survivors = {name: diff for name, diff in diffs.items() if name not in other_os}
    judged = len(status) - len(equivalent) - len(other_os)
    return {"module": module, "total": len(status), "killed": len(killed), "equivalent": equivalent,
            "other_os": other_os, "rate": 100.0 * len(killed) / judged if judged else 100.0,
            "survivors": survivors}


def _other_os(module: str, diff: str) -> bool:
    """Whether the mutant changes only lines that run on another OS (OTHER_OS)."""
    removed = [line[1:] for line in diff.splitlines() if line.startswith("-") and not line.startswith("---")]
    return bool(removed) and all(any(text in line for text, _ in OTHER_OS.get(module, [])) for line in removed)


def changed_modules(base: str) -> list[str]:
    """The modules of MODULES whose source or tests changed since ``base`` (committed or not)."""
    out = subprocess.run(["git", "diff", "--name-only", base, "--"], cwd=ROOT, capture_output=True, text=True,
                         check=True).stdout.split()
    out += subprocess.run(["git", "ls-files", "--others", "--exclude-standard", "tests", "mlx_jupyter"], cwd=ROOT,
                          capture_output=True, text=True, check=True).stdout.split()
    touched = set(out)
    return [m for m, tests in MODULES.items()
            if f"mlx_jupyter/{m}" in touched or any(t.split("::")[0] in touched for t in tests)]


def _base(base: str) -> str:
    """``base``, or for 'auto' the merge base with origin/main when there is one, else HEAD~1."""
    if base != "auto":
        return base
    git = lambda *a: subprocess.run(["git", *a], cwd=ROOT, capture_output=True, text=True)  # noqa: E731
    merge = git("merge-base", "HEAD", "origin/main")
    head = git("rev-parse", "HEAD").stdout.strip()
    if merge.returncode == 0 and merge.stdout.strip() != head:
        return merge.stdout.strip()
    return "HEAD~1" if git("rev-parse", "--verify", "-q", "HEAD~1").returncode == 0 else "HEAD"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("modules", nargs="*", help=f"paths under mlx_jupyter/ (default: all of {', '.join(MODULES)})")
    ap.add_argument("--changed", metavar="BASE", help="only the modules whose source or tests changed since BASE "
                    "(a commit; 'auto': the merge base with origin/main, else the last commit)")
    ap.add_argument("--budget", type=float, default=0, help="start no further module after this many seconds")
    ap.add_argument("--jobs", type=int, default=2, help="mutants tested at once (default 2)")
    ap.add_argument("--min", type=float, default=90.0, help="fail under this kill rate, %% (default 90)")
    ap.add_argument("--report", action="store_true", help="print the last run's results again (no run)")
    ap.add_argument("--save", action="store_true", help=f"write the table to {RESULTS.relative_to(ROOT)}")
    args = ap.parse_args(argv)
    unknown = [m for m in args.modules if m not in MODULES]
    if unknown:
        ap.error(f"not a mutation-tested module: {', '.join(unknown)} (choose from {', '.join(MODULES)})")
    modules = args.modules or (changed_modules(_base(args.changed)) if args.changed else list(MODULES))
    if not modules:
        print("mutation: no planner or parser changed")
        return 0
    rows, low, notes = [], [], []
    began = time.monotonic()
    for i, module in enumerate(modules):
        if args.budget and time.monotonic() - began > args.budget:
            print(f"mutation: over the {args.budget:.0f} s budget; not run: {', '.join(modules[i:])}")
            break
        r = run_module(module, args.jobs, again=not args.report)
        rows.append(f"{module:24} {r['rate']:5.1f} % killed  ({r['killed']} of {r['total']} mutants; "
                    f"{len(r['equivalent'])} equivalent, {len(r['other_os'])} on another OS's lines, "
                    f"{len(r['survivors'])} survived)")
        print(rows[-1], flush=True)
        notes += [f"  {module}: equivalent {name.rsplit('.', 1)[1]}: {EQUIVALENT[name]}" for name in r["equivalent"]]
        notes += [f"  {module}: survived {name.rsplit('.', 1)[1]}" for name in r["survivors"]]
        for name, diff in r["survivors"].items():
            print(f"  survived: {diff.strip()}\n")
        if r["rate"] < args.min:
            low.append(module)
    print("\n".join(["", *rows]))
    if args.save:
        commit = subprocess.check_output(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, text=True).strip()
        head = (f"# .venv/bin/python tests/mutation/run.py [MODULE ...] --save: each module's last run (mutmut "
                f"{_version()}); last written {time.strftime('%Y-%m-%d %H:%M')} on {commit} and uncommitted changes")
        done = {row.split()[0] for row in rows}
        old = RESULTS.read_text().splitlines() if RESULTS.exists() else []   # the modules not run this time
        kept = {line.split()[0]: line for line in old if line.split()[:1] and line.split()[0] in MODULES}
        rows = [next((r for r in rows if r.split()[0] == m), kept.get(m, f"{m:24} (not run yet)"))
                for m in MODULES if m in done or m in kept]
        notes += [line for line in old if line.startswith("  ") and line.split()[0].rstrip(":") not in done]
        RESULTS.write_text("\n".join([head, *rows, "", "Judged equivalent, and survivors:",
                                      *sorted(notes, key=lambda n: list(MODULES).index(n.split()[0].rstrip(":")))]) + "\n")
    if low:
        print(f"mutation: under {args.min:.0f} % killed: {', '.join(low)}")
        return 1
    return 0


def _version() -> str:
    from importlib.metadata import version
    return version("mutmut")


if __name__ == "__main__":
    sys.exit(main())
