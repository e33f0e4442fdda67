"""``mlx-jupyter launch --stdin-rank R``: the terminal's stdin reaches rank R only, e.g. its pdb."""

from __future__ import annotations

import pytest

from tests.launch.launch_helpers import cli

pytestmark = pytest.mark.timeout(60)

SCRIPT = """\
import os
rank = int(os.environ["MLX_RANK"])
x = 40 + rank
if rank == 1:
    breakpoint()
    print("rank 1 went on", flush=True)
else:
    try:
        print("rank 0 read", repr(input()), flush=True)
    except EOFError:
        print("rank 0 stdin: EOF", flush=True)
"""


def test_breakpoint_on_rank_1_answered_from_the_launchers_stdin(tmp_path):
    script = tmp_path / "stop.py"
    script.write_text(SCRIPT)
    res = cli(["-n", "2", "--stdin-rank", "1", str(script)], timeout=45, stdin="p x * 2\nc\n")
    assert res.returncode == 0, (res.stdout, res.stderr)
    lines = res.stdout.splitlines()
    assert any(line.startswith("[rank 1]") and "82" in line for line in lines), res.stdout
    assert any(line.startswith("[rank 1]") and line.endswith("rank 1 went on") for line in lines), res.stdout
    assert "[rank 0] rank 0 stdin: EOF" in lines, res.stdout  # the answers never reached rank 0


@pytest.mark.parametrize("args, fragment", [
    (["-n", "2", "--stdin-rank", "2"], "--stdin-rank 2: the ranks are 0-1"),
    (["-n", "2", "--stdin-rank", "-1"], "argument --stdin-rank: '-1' must be a rank from 0"),
    (["-n", "2", "--backend", "mpi", "--stdin-rank", "0"], "--stdin-rank works with ranks this launcher starts"),
])
def test_bad_stdin_rank_is_named(args, fragment):
    res = cli([*args, "python3", "-c", "pass"], timeout=30)
    assert res.returncode != 0
    assert fragment in res.stderr, res.stderr
    assert "Traceback" not in res.stderr
