"""``mlx-jupyter launch --slurm --where-on-signal``: SIGUSR1 to the launcher reaches every rank of the srun
step (``scancel --signal=USR1``; the task wrapper lets it pass), and each rank's answer comes back through
srun's labelled output as the table of where the ranks are. Real Slurm daemons (tests/slurmbed.py)."""

from __future__ import annotations

import re
import signal
import textwrap

import pytest

from launch_helpers import PY, ROOT, LiveCLI

pytestmark = pytest.mark.timeout(120)

SCRIPT = textwrap.dedent("""\
    import time, mlx.core as mx
    world = mx.distributed.init(backend="ring", strict=True)
    print("ready", flush=True)
    if world.rank() == 1:
        time.sleep(8)
    mx.eval(mx.distributed.all_sum(mx.ones(3), group=world))
""")


def test_sigusr1_names_each_ranks_line_on_its_node(slurm, tmp_path):
    script = tmp_path / "hang.py"
    script.write_text(SCRIPT)
    run = LiveCLI(["--slurm", "--nodes", "2", "--where-on-signal", PY, str(script)],
                  env={**slurm.env(), "PYTHONPATH": str(ROOT)})
    try:
        run.wait_for(r"^\[rank +\d\] ready$", 2, timeout=60)
        run.proc.send_signal(signal.SIGUSR1)
        run.wait_for(r"rank 0 is in mx\.distributed\.all_sum", timeout=15)
        text = "\n".join(run.lines)
        assert re.search(r"^0\s+in mx\.distributed\.all_sum at line 6 waiting on rank 1", text, re.M), text
        assert re.search(r"^1\s+running line 5: time\.sleep\(8\)", text, re.M), text
        assert run.finish(40) == 0, text  # the signal asked; it ended no rank
        assert not re.search(r"User defined signal|\bterminated\b", "\n".join(run.lines)), run.lines
    finally:
        if run.proc.poll() is None:
            run.proc.kill()
            run.finish(10)
