"""``mlx-jupyter launch --slurm --where-on-signal``: SIGUSR1 to the launcher reaches every rank of the srun
step (``scancel --signal=USR1``; the task wrapper lets it pass), and each rank's answer comes back through
srun's labelled output as the table of where the ranks are. Real Slurm daemons (tests/slurmbed.py)."""

from __future__ import annotations

import re
import textwrap

import pytest

from launch_helpers import PY, ROOT, LiveCLI

pytestmark = pytest.mark.timeout(120)

# rank 1 is held 4 s: the table matches within 0.1 s of "ready" here (asked again 0.3 s later when not); a
# second more than the local launch's 3 s for scancel's and srun's relays.
SCRIPT = textwrap.dedent("""\
    import time, mlx.core as mx
    world = mx.distributed.init(backend="ring", strict=True)
    print("ready", flush=True)
    if world.rank() == 1:
        time.sleep(4)
    mx.eval(mx.distributed.all_sum(mx.ones(3), group=world))
""")


def test_sigusr1_names_each_ranks_line_on_its_node(slurm, tmp_path):
    script = tmp_path / "hang.py"
    script.write_text(SCRIPT)
    with LiveCLI(["--slurm", "--nodes", "2", "--where-on-signal", PY, str(script)],
                 env={**slurm.env(), "PYTHONPATH": str(ROOT)}) as run:
        run.wait_for(r"^\[rank +\d\] ready$", 2, timeout=60)
        run.where_showing([r"^0\s+waits in MLX all_sum #1 \(float32\[3\], built at line 6, evaluated at line 6\) "
                           r"on rank 1", r"^1\s+has called 0 MLX collectives and is at line 5: time\.sleep\(4\)"],
                          ranks=2, timeout=25, per_ask=8.0)
        assert run.finish(40) == 0, run.text  # the signals asked; they ended no rank
        assert not re.search(r"User defined signal|\bterminated\b", run.text), run.lines
