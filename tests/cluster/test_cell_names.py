"""A cell's lines as the editor numbers them (``cluster/rank/cell_names.py``), in an IPython shell of this process."""

from __future__ import annotations

import linecache
import re

import pytest
from IPython.core.interactiveshell import InteractiveShell

from mlx_jupyter.cluster.rank.cell_names import number_cells_as

CELL = "v = 1\nw = v + 1\nraise ValueError('at line 3 of the code')\n"


@pytest.fixture
def shell():
    """IPython's shell of this process, made for the test and gone after it: a shell left behind (with its
    execution count) would make later tests of this process look as if they ran in a notebook."""
    existed = InteractiveShell.initialized()
    ip = InteractiveShell.instance()
    count = ip.execution_count
    yield ip
    number_cells_as(ip, 0)
    ip.execution_count = count
    if not existed:
        InteractiveShell.clear_instance()


def _raised_at(result) -> tuple[str, int]:
    tb = result.error_in_exec.__traceback__
    while tb.tb_next is not None:
        tb = tb.tb_next
    return tb.tb_frame.f_code.co_filename, tb.tb_lineno


def test_under_the_magic_the_code_starts_on_line_2_in_frames_and_linecache(shell):
    number_cells_as(shell, 0, first_line=2)
    res = shell.run_cell(CELL)
    name, line = _raised_at(res)
    assert line == 4   # the editor's: %%mlx_distributed is line 1
    assert linecache.getline(name, 4).strip() == "raise ValueError('at line 3 of the code')"   # what pdb lists


def test_from_python_the_code_starts_on_line_1(shell):
    number_cells_as(shell, 0)
    res = shell.run_cell(CELL)
    name, line = _raised_at(res)
    assert line == 3 and linecache.getline(name, 3).startswith("raise ValueError")


def test_a_syntax_error_names_the_editors_line(shell):
    number_cells_as(shell, 0, first_line=2)
    res = shell.run_cell("x = 1\ny = (\n")
    assert isinstance(res.error_before_exec, SyntaxError) and res.error_before_exec.lineno == 3


def test_the_notebooks_number_names_the_cell(shell, capsys):
    number_cells_as(shell, 7, first_line=2)
    shell.run_cell(CELL)
    shown = re.sub(r"\x1b\[[0-9;]*m", "", capsys.readouterr().out)
    assert "Cell In[7], line 4" in shown and "----> 4 raise ValueError" in shown, shown
