"""A selection of no rank (``--targets 5-2``, ``:0``, ``2:``, ``1-0``; ``targets=[]``) is refused at
once, naming the flag or argument, the ranks there are and the fix: it used to hang for good (issue 44 §3)."""

from __future__ import annotations

import re
import time

import pytest

from mlx_jupyter.cluster.cells.targets import TargetsError, check_targets, parse_targets
from tests.cluster.kernel import Kernel

pytestmark = pytest.mark.timeout(150)

#: the selections of the issue, each naming no rank of a 2-rank cluster
EMPTY = ["5-2", ":0", "2:", "1-0"]
ANSI = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")


@pytest.mark.parametrize("spec", EMPTY)
def test_a_selection_of_no_rank_is_an_error_naming_the_flag_the_ranks_and_the_fix(spec):
    with pytest.raises(TargetsError) as err:
        parse_targets(spec, 2)
    text = str(err.value)
    assert text.startswith(f"--targets {spec} selects no rank"), text
    assert "this cluster has 2 ranks (0-1)" in text and "--targets 0-1" in text, text


def test_why_a_selection_is_empty_is_said():
    assert "the range 5-2 runs backwards (write 2-5)" in str(pytest.raises(TargetsError, parse_targets, "5-2", 8).value)
    assert "the slice starts at 2, past the last rank (1)" in str(pytest.raises(TargetsError, parse_targets, "2:", 2).value)
    assert parse_targets("1:", 2) == [1] and parse_targets("0-1", 2) == [0, 1]
    with pytest.raises(ValueError, match=r"--targets x: not a selection of ranks; write it as all, 0"):
        parse_targets("x", 2)


@pytest.mark.parametrize("targets, words", [
    ([], "targets=[] selects no rank"), (range(5, 3), "selects no rank"), ([2], "targets=[2]: no rank 2"),
    ([0, 0], "names rank 0 more than once"), ("0", "give a list of ranks"), ([True], "is not a rank number"),
])
def test_the_python_apis_targets_are_checked_the_same_way(targets, words):
    with pytest.raises(TargetsError) as err:
        check_targets(targets, 2)
    assert words in str(err.value) and "this cluster has 2 ranks (0-1)" in str(err.value), err.value
    assert check_targets(None, 2) == [0, 1] and check_targets((1,), 2) == [1]


def test_the_magic_refuses_each_empty_selection_at_once_in_a_real_kernel():
    k = Kernel()
    try:
        res = k.run("%load_ext mlx_jupyter\n%mlx_cluster start -n 2", timeout=120)
        assert res.status == "ok", res
        for spec in EMPTY:
            res = k.run(f"%%mlx_distributed --targets {spec}\nprint('ran')", timeout=30)
            text = ANSI.sub("", res.traceback + res.stdout + res.stderr)
            assert res.status == "error" and res.elapsed < 5, (spec, res.elapsed, text)
            assert f"--targets {spec} selects no rank" in text and "(0-1)" in text, text
            assert "ran" not in res.stdout
        res = k.run("%%mlx_distributed --targets 1:\nprint('ran on', world.rank())", timeout=60)
        assert res.status == "ok" and "ran on 1" in res.stdout, res
    finally:
        k.run("%mlx_cluster stop", timeout=60)
        k.close()


def test_cluster_execute_refuses_a_selection_of_no_rank_at_once():
    from mlx_jupyter import Cluster

    c = Cluster(n=2, timeout=60).start()
    try:
        for targets in ([], range(5, 3), [2]):
            t0 = time.monotonic()
            with pytest.raises(TargetsError) as err:
                c.execute("print('ran')", targets=targets, timeout=3)
            assert time.monotonic() - t0 < 5
            assert str(err.value).startswith("targets=") and "this cluster has 2 ranks (0-1)" in str(err.value)
        with pytest.raises(TargetsError, match="targets=\\[\\] selects no rank"):
            c.pull("x", targets=[])
        assert c.execute("world.rank()", targets=[1], timeout=60) == ["1"]
    finally:
        c.stop()
