"""A restart stopped before its new ranks connected (Ctrl-C, or a failure) leaves a cluster that says so at every
request, in ``status()`` too, until a restart mends it (issue 44 §5: it used to show every rank running while
``pull`` raised ipyparallel's raw ``NoEnginesRegistered``). Real ranks."""

from __future__ import annotations

import pytest

from mlx_jupyter.cluster import Cluster, ClusterError

pytestmark = pytest.mark.timeout(150)

NOT_RUNNING = "not running: the last restart was interrupted before the new ranks connected"


def _interrupt(have: int, size: int) -> None:
    """The restart's first progress report (the new ranks are starting): the user presses Stop."""
    raise KeyboardInterrupt


def test_after_an_interrupted_restart_every_request_says_so_and_a_restart_mends_it():
    with Cluster(n=2) as c:
        c.execute("x = 1")
        with pytest.raises(KeyboardInterrupt):
            c.restart(progress=_interrupt, timeout=60)
        assert [row["state"] for row in c.status()] == [NOT_RUNNING, NOT_RUNNING]
        refusal = (r"^the ranks are not running: the last restart was interrupted before the new ranks connected\n"
                   r"restart the ranks: cluster\.restart\(\)")
        for request in (lambda: c.pull("x"), lambda: c.execute("y = 1"), lambda: c.push({"y": 1})):
            with pytest.raises(ClusterError, match=refusal):
                request()
        c.restart(timeout=60, quiet=True)
        c.execute("y = world.rank() + 2")
        assert c.pull("y") == [2, 3]
        assert [row["state"] for row in c.status()] == ["idle", "idle"]


def test_a_rank_killed_while_saving_gets_the_names_its_peers_hold_alike():
    """Rank 0 dies in the middle of the restart's save (a name whose pickling kills it): it is a dead rank like
    one that died before, so its peers give it what they hold alike (it used to lose everything)."""
    from mlx_jupyter.cluster.cells.display import show_run

    with Cluster(n=3) as c:
        show_run(c.run("import os, numpy as np\n"
                       "class Bomb:\n"
                       "    def __reduce__(self):\n"
                       "        os.kill(os.getpid(), 9)\n"
                       "alike = np.arange(4) * 3\n"
                       "mine = world.rank()\n"
                       "if world.rank() == 0:\n"
                       "    bomb = Bomb()"), timeout=30)
        c.restart(timeout=60, quiet=True)
        line = c.last_restart
        assert "rank 0 died" in line and "everything on rank 0" not in line, line
        show_run(c.run("got = [globals().get('alike', np.zeros(1)).tolist(), globals().get('mine')]"), timeout=30)
        assert c.pull("got") == [[[0, 3, 6, 9], None], [[0, 3, 6, 9], 1], [[0, 3, 6, 9], 2]]
