"""Help for the magics in a real kernel: ``%%mlx_distributed --help``, ``%mlx_cluster`` alone, one action's options."""

from __future__ import annotations

import pytest

from mlx_jupyter.magic_help import CLUSTER_ACTIONS, cluster_action_help
from mlx_jupyter.magics import MLXMagics
from tests.cluster.kernel import Kernel

pytestmark = pytest.mark.timeout(60)


@pytest.fixture(scope="module")
def kernel():
    k = Kernel()
    try:
        assert k.run("%load_ext mlx_jupyter").status == "ok"
        yield k
    finally:
        k.close()


def test_distributed_help_lists_its_options_and_runs_nothing(kernel):
    res = kernel.run("%%mlx_distributed --help\nraise SystemExit('the cell ran')")
    assert res.status == "ok" and not res.error, res
    assert res.stdout.startswith("usage: %%mlx_distributed")
    for flag in ("--targets", "--noblock", "--timeout", "--output", "--no-init"):
        assert flag in res.stdout
    assert "unrecognized" not in res.stdout + res.stderr
    assert kernel.run("%%mlx_distributed -h\npass").stdout == res.stdout


@pytest.mark.parametrize("cell", ["%%mlx_distributed --help", "%%mlx_distributed -h\n", "%%mlx_distributed -t 0 --help"])
def test_distributed_help_with_an_empty_body_shows_the_help(kernel, cell):
    res = kernel.run(cell)
    assert res.status == "ok" and not res.error, res
    assert res.stdout.startswith("usage: %%mlx_distributed") and "--targets" in res.stdout, res.stdout
    assert "body is empty" not in res.stdout + res.stderr


def test_cluster_alone_lists_every_action_with_a_line(kernel):
    res = kernel.run("%mlx_cluster")
    assert res.status == "ok", res
    lines = res.stdout.splitlines()
    for action, (summary, _) in CLUSTER_ACTIONS.items():
        assert any(line.split()[:1] == [action] and summary in line for line in lines), (action, res.stdout)
    assert "%mlx_cluster help ACTION" in res.stdout


@pytest.mark.parametrize("line", ["%mlx_cluster help start", "%mlx_cluster start --help", "%mlx_cluster start -h"])
def test_one_actions_options(kernel, line):
    res = kernel.run(line)
    assert res.status == "ok", res
    assert res.stdout.startswith("usage: %mlx_cluster start")
    assert "--hostfile" in res.stdout and "--connect-timeout" in res.stdout
    assert "--targets" not in res.stdout  # not %%mlx_distributed's


def test_an_unknown_action_names_the_actions(kernel):
    res = kernel.run("%mlx_cluster help strat")
    assert res.status == "error"
    assert "no action 'strat'" in res.traceback and "start" in res.traceback


def test_every_action_flag_is_one_the_magic_accepts():
    """The per-action table names only options the magic's parser has (a renamed flag fails here)."""
    known = {s for a in MLXMagics.mlx_cluster.parser._actions for s in a.option_strings} | {"cluster_id"}
    for action, (_, names) in CLUSTER_ACTIONS.items():
        assert set(names) <= known, action
        text = cluster_action_help(MLXMagics.mlx_cluster, action)
        for name in names:
            assert name in text, (action, name)


def test_restart_and_status_options_are_theirs_only():
    assert "--hosts" not in cluster_action_help(MLXMagics.mlx_cluster, "restart")
    assert "--timeout" in cluster_action_help(MLXMagics.mlx_cluster, "restart")
    assert "options:" not in cluster_action_help(MLXMagics.mlx_cluster, "status")
