"""A bare ``%%mlx_distributed`` cell starts on the ranks as the kernel takes it (mlx_jupyter.early_cells):
before IPython runs the magic, with the same outputs and errors; anything else takes the usual way,
and a run no magic claimed is shown, never lost."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from IPython.core.interactiveshell import InteractiveShell

from mlx_jupyter import early_cells
from tests.cluster.kernel import cluster_kernel

pytestmark = pytest.mark.timeout(120)

#: when IPython began each cell (pre_run_cell) and when the notebook sent cells to the ranks
STAMPS = ("import time as _t\nfrom mlx_jupyter import magics as _m\n_pre, _sent = [], []\n"
          "get_ipython().events.register('pre_run_cell', lambda *a: _pre.append(_t.monotonic()))\n"
          "_server = _m.current().cell_server\n_send = _server.send_cells\n"
          "def _stamped(*a, **k):\n    _sent.append(_t.monotonic())\n    return _send(*a, **k)\n"
          "_server.send_cells = _stamped")


@pytest.fixture(scope="module")
def kernel():
    k = next(gen := cluster_kernel(2, 90, stop=True))
    res = k.run(STAMPS)
    assert res.status == "ok", res
    res = k.run("%%mlx_distributed\n_first = 1")   # the first cell defines mx, world and group: the usual way
    assert res.status == "ok", res
    yield k
    next(gen, None)


def _sent_before_ipython_began(kernel, cell: str) -> bool:
    """Whether the notebook sent ``cell`` to the ranks before IPython began running it."""
    res = kernel.run(cell)
    assert res.status == "ok", res
    res = kernel.run("print(_sent[-1] < _pre[-2])")   # _pre[-1]: this very cell
    assert res.status == "ok", res
    return res.stdout.strip() == "True"


def test_a_bare_cell_starts_on_the_ranks_before_the_notebook_runs_its_magic(kernel):
    assert _sent_before_ipython_began(kernel, "%%mlx_distributed\nx = 1")
    res = kernel.run("%%mlx_distributed\nprint('hello from', world.rank())")
    assert res.status == "ok" and "[rank 0] hello from 0" in res.stdout and "[rank 1] hello from 1" in res.stdout, res


def test_a_cell_with_options_takes_the_usual_way(kernel):
    assert not _sent_before_ipython_began(kernel, "%%mlx_distributed --targets all\nx = 1")


def test_an_early_cell_that_raises_is_shown_as_any_cell(kernel):
    res = kernel.run("%%mlx_distributed\nraise ValueError(f'on purpose {world.rank()}')")
    assert res.status == "error", res
    text = res.traceback + res.stdout
    assert "ValueError" in text and "on purpose" in text, text
    count = kernel.run("print(get_ipython().execution_count - 1)").stdout.strip()
    assert f"Cell In[{int(count) - 1}]" in text, (count, text)   # the notebook's number for that cell
    assert kernel.run("%%mlx_distributed\n_ok = 1").status == "ok"


def test_a_run_no_magic_claimed_is_shown_after_its_cell(kernel):
    """IPython never called the magic (e.g. an interrupt in between): the run's output still shows."""
    res = kernel.run("from mlx_jupyter import early_cells, magics\n"
                     "_parent = get_ipython().kernel.get_parent('shell')\n"
                     "_early = early_cells.start(get_ipython(), magics.current(), {**_parent, 'content': "
                     "{'code': '%%mlx_distributed\\nprint(\"unclaimed\", world.rank())'}})\n"
                     "print('started', _early is not None)")
    assert res.status == "ok" and "started True" in res.stdout, res
    assert "[rank 0] unclaimed 0" in res.stdout and "[rank 1] unclaimed 1" in res.stdout, res.stdout


def test_an_interrupted_cell_stops_the_run_it_started_early(kernel):
    res = kernel.run("from mlx_jupyter import early_cells, magics\nimport time\n"
                     "_parent = get_ipython().kernel.get_parent('shell')\n"
                     "_early = early_cells.start(get_ipython(), magics.current(), {**_parent, 'content': "
                     "{'code': '%%mlx_distributed\\nimport time\\ntime.sleep(60)'}})\n"
                     "class _Result:\n    error_before_exec = None\n    error_in_exec = KeyboardInterrupt()\n"
                     "_t0 = time.monotonic()\nearly_cells._unclaimed(_Result())\n"
                     "print('ended after', round(time.monotonic() - _t0), 's')", timeout=60)
    assert res.status == "ok", res
    assert "ended after" in res.stdout and int(res.stdout.split("ended after")[1].split()[0]) < 10, res.stdout
    assert "interrupted by the user" in res.stdout, res.stdout
    assert kernel.run("%%mlx_distributed\n_ok = 2").status == "ok"


# ---------------------------------------------------------------- the call IPython makes


@pytest.fixture(scope="module")
def shell():
    """An in-process IPython shell whose ``%%mlx_distributed`` records what it was called with."""
    ip = InteractiveShell()   # not the process's singleton: other tests' shells are left alone
    calls: list[tuple[str, str]] = []

    def record(line, cell):
        calls.append((line, cell))

    ip.register_magic_function(record, "cell", "mlx_distributed")
    ip._recorded = calls
    yield ip


def _called_with(ip, code: str):
    ip._recorded.clear()
    ip.run_cell(code, store_history=False)
    return ip._recorded[-1] if ip._recorded else None


@pytest.mark.parametrize("code", [
    "%%mlx_distributed\nx = 1",
    "%%mlx_distributed  \nx = 1\n\n",
    "%%mlx_distributed\n>>> x = 1\n... y = 2",
    "%%mlx_distributed\nprint('''a\\nb''')\n# é ∑ \\t",
    "%%mlx_distributed\n    indented = 1",
])
def test_the_call_read_ahead_is_the_call_ipython_makes(shell, code):
    assert early_cells.magic_call(shell, code) == _called_with(shell, code)


@settings(max_examples=60, deadline=None)
@given(st.lists(st.text(st.characters(blacklist_categories=("Cs",), blacklist_characters="\r\x0b\x0c\x1c\x1d\x1e"
                                                                                  "\x85\u2028\u2029"),
                        max_size=30), min_size=1, max_size=4))
def test_any_body_is_read_ahead_as_ipython_passes_it_or_not_at_all(shell, lines):
    code = "%%mlx_distributed\n" + "\n".join(lines)
    ahead = early_cells.magic_call(shell, code)
    if ahead is not None:
        assert ahead == _called_with(shell, code)


def test_nothing_is_read_ahead_when_something_may_change_the_call(shell):
    import ast

    class Anything(ast.NodeTransformer):
        pass

    shell.ast_transformers.append(Anything())
    try:
        assert early_cells.magic_call(shell, "%%mlx_distributed\nx = 1") is None
    finally:
        shell.ast_transformers.pop()
    assert early_cells.magic_call(shell, "%%time\nx = 1") is None
    assert early_cells.magic_call(shell, "x = 1") is None


@pytest.mark.parametrize("code, silent", [
    ("%%mlx_distributed --targets 0\nx = 1", False),   # options: the usual way
    ("%%mlx_distributed\n\n", False),                  # no body: IPython's own error
    ("%%mlx_distributed\nx = 1", True),                # silent requests
    ("%%mlx_distributedx\nx = 1", False),
    ("x = 1", False),
])
def test_only_a_bare_cell_with_a_body_starts_early(shell, code, silent):
    class Ready:   # never reached for these cells: the request is refused before the cluster is looked at
        def run(self, body):
            raise AssertionError("started")

    parent = {"header": {"msg_id": "m1"}, "content": {"code": code, "silent": silent}}
    assert early_cells.start(shell, Ready(), parent) is None
