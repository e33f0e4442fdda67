"""One record for each backend (issue 34 §2): every layer asks it, none compares a backend's name.

Pure: the package's source is grepped; the records and what is derived from them are compared.
"""

from __future__ import annotations

import re
from pathlib import Path

from mlx_jupyter import distributed, hostfile
from mlx_jupyter.vocab import options
from mlx_jupyter.collective.mlx_backends import MLX_FIX
from mlx_jupyter.launch import local
from mlx_jupyter.vocab import backends
from mlx_jupyter.launch import command as launch_cli
from mlx_jupyter.launch.addresses import needing_address
from mlx_jupyter.launch.slurm.job import SLURM_BACKENDS
from mlx_jupyter.magic_help import cluster_action_help
from mlx_jupyter.magics import MLXMagics
from mlx_jupyter.server import requests
from mlx_jupyter.topology.choice import CONFIG_BACKENDS

PACKAGE = Path(options.__file__).resolve().parent
RECORDS_FILE = Path(backends.__file__).resolve()
#: a branch on a backend's name: `backend == "ring"`, `c.backend != "mpi"`, `backend in ("jaccl", ...)`
BRANCH = re.compile(r"""backend\s*(?:==|!=)\s*["']|backend\s+(?:not\s+)?in\s+\(\s*["']""")


def test_no_module_branches_on_a_backend_name() -> None:
    found = [f"{p.relative_to(PACKAGE)}:{i}: {line.strip()}"
             for p in sorted(PACKAGE.rglob("*.py")) if p.resolve() != RECORDS_FILE
             for i, line in enumerate(p.read_text().splitlines(), 1) if BRANCH.search(line)]
    assert found == []


def test_the_grep_finds_a_branch() -> None:
    assert BRANCH.search('if c.backend == "mpi":') and BRANCH.search("if backend in ('jaccl', 'nccl'):")
    assert not BRANCH.search("if record.mpirun:")


def test_one_record_per_backend_and_every_list_is_theirs() -> None:
    names = [b.name for b in backends.RECORDS]
    assert len(set(names)) == len(names) and tuple(names) == backends.NAMES
    assert hostfile.BACKENDS == distributed.BACKENDS == backends.NAMES
    assert all(b.install and b.contract in ("ring", "jaccl", "nccl", "mpi") for b in backends.RECORDS)
    assert all(b.addresses in ("every", "first", "none") for b in backends.RECORDS)
    assert set(MLX_FIX) == set(names)
    assert set(local.CHECKED_BACKENDS) == {b.name for b in backends.RECORDS if b.checked}
    assert set(SLURM_BACKENDS) == {b.name for b in backends.RECORDS if b.slurm}
    assert set(CONFIG_BACKENDS) == {b.name for b in backends.RECORDS if b.configurable}


def test_the_default_rule_is_the_records() -> None:
    assert [b.name for b in backends.RECORDS if b.default_when == "otherwise"] == ["ring"]
    assert backends.DEFAULT_RULE == "the hostfile's, else nccl with CUDA, else ring"
    assert backends.default_backend() in ("ring", "nccl")   # nccl only where MLX sees CUDA


def test_help_texts_list_the_backends_from_the_records() -> None:
    listed = backends.listed()
    assert listed == "ring, jaccl, jaccl-ring, nccl or mpi"
    start = " ".join(cluster_action_help(MLXMagics.mlx_cluster, "start").split())
    assert listed in start and backends.DEFAULT_RULE in start
    cli = next(a for a in launch_cli.build_parser()._actions if "--backend" in a.option_strings)
    assert tuple(cli.choices) == backends.NAMES and listed in cli.help
    assert all(name in requests.FIELDS["backend"] for name in backends.NAMES)


def test_which_ranks_need_an_address_is_the_record() -> None:
    hosts = [hostfile.Host("a"), hostfile.Host("b", ["10.0.0.2"]), hostfile.Host("c")]
    wanted = {"every": [0, 2], "first": [0], "none": []}
    for b in backends.RECORDS:
        assert needing_address(b.name, hosts) == wanted[b.addresses], b.name


def test_an_unknown_name_is_refused_naming_the_backends() -> None:
    try:
        backends.get("gloo")
    except ValueError as exc:
        assert "gloo" in str(exc) and "ring" in str(exc)
    else:
        raise AssertionError("gloo was accepted")
    assert backends.find("any") is None and backends.find(None) is None
    assert backends.mlx_name("jaccl-ring") == "jaccl" and backends.mlx_name("ring") == "ring"
