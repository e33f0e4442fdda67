"""docs/slurm.md's commands, as written: the launch lines parse, the test bed's session runs on the bed."""

from __future__ import annotations

import re
import shlex

from slurm_helpers import ROOT
from launch_helpers import PY, cli

DOC = (ROOT / "docs" / "slurm.md").read_text()


def bash_lines() -> list[str]:
    return [line.split("  #")[0].strip() for block in re.findall(r"```bash\n(.*?)```", DOC, flags=re.S)
            for line in block.splitlines() if line.strip()]


def test_launch_lines_are_valid_command_lines():
    from mlx_jupyter.launch.command import build_parser, make_config, split_argv

    lines = [line for line in bash_lines() if line.startswith("mlx-jupyter launch")]
    assert len(lines) == 2
    for line in lines:
        opts, command = split_argv(shlex.split(line)[2:], build_parser())
        config = make_config(build_parser().parse_args(opts), command)
        assert config.slurm is not None and command[:2] == ["python", "train.py"]


def test_the_test_bed_session_runs_as_written(slurm):
    lines = bash_lines()
    assert "sudo .venv/bin/python tests/slurmbed.py up" in lines and "sudo .venv/bin/python tests/slurmbed.py down" in lines
    launch = next(line for line in lines if line.startswith(".venv/bin/mlx-jupyter launch"))
    argv = [PY if a == ".venv/bin/python" else a for a in shlex.split(launch)[2:]]
    res = cli(argv, env={**slurm.env(), "PYTHONPATH": str(ROOT)})
    assert res.returncode == 0, res.stderr
    assert sorted(res.stdout.splitlines()) == [f"[rank {r}] {r} [4.0, 4.0]" for r in range(4)]


def cell_blocks() -> list[str]:
    """The notebook cells of the section on cells (python blocks with % lines)."""
    section = DOC.split("## Cells on a Slurm cluster", 1)[1].split("\n## ", 1)[0]
    return re.findall(r"```python\n(.*?)```", section, flags=re.S)


def test_the_cells_section_runs_as_written_on_the_bed(slurm):
    from tests.cluster.kernel import Kernel

    cells = cell_blocks()
    assert len(cells) == 3 and cells[0].startswith("%load_ext mlx_jupyter")
    k = Kernel(env={**slurm.env(), "PYTHONPATH": str(ROOT)})
    try:
        res = [k.run(cell, 60) for cell in cells]
        assert all(r.status == "ok" for r in res), [r.traceback for r in res]
        assert all(f"{r} [4.0, 4.0]" in res[1].stdout for r in range(4)), res[1].stdout
        assert re.search(r"Slurm job \d+ RUNNING on node\[1-2\], (30 min|29 min \d+ s) left", res[2].stdout), \
            res[2].stdout
    finally:
        k.close()
