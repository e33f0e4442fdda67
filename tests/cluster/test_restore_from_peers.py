"""A rank killed with SIGKILL comes back, at a keep-state restart, with what its live peers hold
alike: real ranks, real MLX. A data-parallel MLP (mlx.nn, mlx.optimizers, gradients averaged with
all_sum) trained a few steps, a rank killed, a restart: the next step's loss is the uninterrupted
run's, bit for bit, on every rank; the names that differ across ranks are named as lost.
"""

from __future__ import annotations

import pytest

from mlx_jupyter.cluster import Cluster
from mlx_jupyter.cluster.cells.display import DistributedCellError, show_run
from mlx_jupyter.cluster.peer_restore import PeerCopy, alike, choose_peer
from mlx_jupyter.cluster.rank import keep, keep_files, peer_copy

#: three data-parallel steps; ``shard`` and ``losses`` differ across ranks, the rest is replicated
TRAIN = """
import os, time, numpy as np
import mlx.nn as nn, mlx.optimizers as optim
from mlx.utils import tree_map
mx.random.seed(0)
class MLP(nn.Module):
    def __init__(self):
        super().__init__()
        self.l1 = nn.Linear(8, 16)
        self.l2 = nn.Linear(16, 1)
    def __call__(self, x):
        return self.l2(nn.relu(self.l1(x)))
model = MLP()
mx.eval(model.parameters())
opt = optim.Adam(learning_rate=1e-2)
X = mx.random.normal((64, 8), key=mx.random.key(1))
Y = mx.random.normal((64, 1), key=mx.random.key(2))
def loss_fn(m, x, y):
    return nn.losses.mse_loss(m(x), y)
grad_fn = nn.value_and_grad(model, loss_fn)
def train_step():
    n, r = world.size(), world.rank()
    loss, grads = grad_fn(model, X[r::n], Y[r::n])
    grads = tree_map(lambda g: mx.distributed.all_sum(g, group=world) / n, grads)
    opt.update(model, grads)
    mx.eval(model.parameters(), opt.state, loss)
    return np.array(loss).tobytes().hex()
shard = X[world.rank()::world.size()]
losses = [train_step() for _ in range(3)]
"""

KILL = "if world.rank() == {rank}:\n    os.kill(os.getpid(), 9)\ntime.sleep(30)"


def _killed_then_next_step(c: Cluster, rank: int) -> list[str]:
    """Train, SIGKILL ``rank``, restart keeping names; each rank's next loss (bytes, as hex)."""
    show_run(c.run(TRAIN), timeout=60)
    with pytest.raises(DistributedCellError, match=f"rank {rank} died"):
        show_run(c.run(KILL.format(rank=rank)), timeout=30)
    c.restart(timeout=90, quiet=True)
    show_run(c.run("nxt = train_step()"), timeout=30)
    return c.pull("nxt")


def _uninterrupted_next_step(c: Cluster) -> list[str]:
    """The same training on empty ranks (``--clean``), never killed: each rank's fourth loss."""
    c.restart(timeout=90, quiet=True, clean=True)
    assert c.last_restart == f"restart: {c.size} ranks started empty (--clean)" and c.restart_origins == {}
    show_run(c.run("gone = [k for k in ('model', 'opt', 'np') if k in globals()]"), timeout=30)
    assert c.pull("gone") == [[]] * c.size
    show_run(c.run(TRAIN + "\nnxt = train_step()"), timeout=60)
    return c.pull("nxt")


@pytest.mark.timeout(200)
def test_two_ranks_a_killed_rank_trains_on_bit_for_bit():
    with Cluster(n=2) as c:
        after = _killed_then_next_step(c, 1)
        line = c.last_restart
        assert line.endswith("; rank 1 died: 10 names restored from rank 0 (MLP, X, Y, grad_fn, loss_fn, losses, …) "
                             "and its imports (rank 0 was the only live rank, nothing to compare with: every name its "
                             "cells did not compute from the rank's number or process was copied); lost: shard "
                             "(computed from the rank's number or process)"), line
        assert "\n" not in line and "everything on rank 1" not in line
        assert c.restart_origins == {0: "its own names", 1: "from rank 0 (10 names)"}
        assert after == _uninterrupted_next_step(c)


@pytest.mark.timeout(300)
def test_four_ranks_a_killed_rank_gets_what_the_others_hold_alike_and_loses_what_differs():
    with Cluster(n=4) as c:
        after = _killed_then_next_step(c, 2)
        line = c.last_restart
        assert line.startswith("restart: kept 16 names on 3 ranks ("), line
        assert line.endswith("; rank 2 died: 9 names restored from rank 0 (MLP, X, Y, grad_fn, loss_fn, model, …) "
                             "and its imports; lost: losses, shard (they differ across ranks)"), line
        show_run(c.run("has = [k in globals() for k in ('shard', 'losses', 'train_step', 'opt')]"), timeout=30)
        assert c.pull("has") == [[True, True, True, True]] * 2 + [[False, False, True, True]] + \
            [[True, True, True, True]]
        assert c.restart_origins[2] == "from rank 0 (9 names)" and c.restart_origins[3] == "its own names"
        assert after == _uninterrupted_next_step(c)


# ---------------------------------------------------------------- the parts, without a cluster


def test_only_names_every_live_rank_holds_with_one_digest_are_alike():
    saved = {0: {"digests": {"a": "1", "b": "2", "c": "3"}}, 2: {"digests": {"a": "1", "b": "9"}}}
    assert alike(saved) == (["a"], ["b", "c"])
    assert alike({0: {"kept": []}}) == ([], [])   # saved without digests: nothing to compare


def test_the_peer_is_a_live_rank_on_the_dead_ranks_host():
    hosts = {0: "10.0.0.1", 1: "10.0.0.2", 2: "10.0.0.2", 3: "10.0.0.1"}   # data: never dialled
    assert choose_peer(3, [0, 1, 2], hosts) == 0 and choose_peer(1, [0, 2], hosts) == 2
    assert choose_peer(1, [0, 3], hosts) is None


def test_with_one_live_rank_the_names_its_cells_computed_from_the_rank_number_are_left_out():
    cells = ["x = world.rank()\nimport os\nr = int(os.environ['MLX_RANK'])",
             "Xs, Ys = X[world.rank()::world.size()], Y[r::2]\nmodel = MLP()\nfor i in range(3):\n"
             "    loss, g = lg(model, Xs, Ys)\n    g = average(g)\n    opt.update(model, g)\n"
             "    losses.append(loss.item())\ndef f():\n    z = world.rank()\n",
             "get_ipython().run_line_magic('time', '')", "not python ("]
    # the optimizer took averaged gradients: not the rank's own (a parse cannot tell, so only fills count)
    assert peer_copy.rank_dependent(cells) == ["Xs", "Ys", "g", "loss", "losses", "r", "x"]


def test_the_clause_names_what_came_back_and_what_was_lost():
    copy = PeerCopy(got={1: {"peer": 0, "restored": ["model", "opt"], "imports": ["np"],
                             "failed": {"f": "could not be restored: boom"}}}, differ=["shard"], live=2)
    assert copy.clause(1) == ("rank 1 died: 2 names restored from rank 0 (model, opt) and its imports; "
                              "lost: shard (it differs across ranks), f (could not be restored: boom)")


def _saved_folder(ns: dict) -> str:
    name = keep_files.folder_name("peers-test", "0" * 16)
    answer = keep.save(name, 0, ns, digests=True)
    assert set(answer["digests"]) == set(answer["kept"]) - set(answer["modules"])
    return name


def test_a_copied_function_leaves_no_global_of_the_peer_behind():
    """A function that reads a name the copy leaves out (a shard) must not bind the peer's value."""
    ns: dict = {}
    exec("import math\nshard = [1, 2]\ndef f():\n    return len(shard)\nsame = 7", ns)
    del ns["__builtins__"]
    name = _saved_folder(ns)
    try:
        new: dict = {}
        got = peer_copy.restore_from(name, 0, ["same"], new)
        assert got["restored"] == ["same"] and got["imports"] == ["math"] and set(new) == {"same", "math"}
        new = {}
        peer_copy.restore_from(name, 0, ["f"], new)   # f alone: its pickle names `shard`, the copy does not
        assert set(new) == {"f", "math"}
    finally:
        keep.discard(name, 0)


def test_nn_value_and_grad_comes_back_with_its_transform_and_a_bare_mlx_transform_is_refused():
    import mlx.core as mx
    import mlx.nn as nn

    ns: dict = {"mx": mx, "nn": nn}
    exec("model = nn.Linear(3, 1)\nloss = lambda m, x: (m(x) ** 2).sum()\ng = nn.value_and_grad(model, loss)\n"
         "raw = mx.grad(lambda x: (x ** 2).sum())", ns)
    del ns["__builtins__"]
    name = keep_files.folder_name("peers-test", "1" * 16)
    answer = keep.save(name, 0, ns)
    assert answer["not_kept"] == {"raw": "an MLX transform (mx.grad, mx.value_and_grad, mx.compile...): make it again"}
    new: dict = {}
    keep.restore(name, 0, new)
    x = mx.ones((2, 3))
    value, grads = new["g"](new["model"], x)
    want_value, want_grads = ns["g"](ns["model"], x)
    assert value.item() == want_value.item() and mx.array_equal(grads["weight"], want_grads["weight"]).item()
    new["model"].update({"weight": mx.zeros((1, 3))})   # the rebuilt g differentiates the restored model
    assert new["g"](new["model"], x)[0].item() == (new["model"](x) ** 2).sum().item()


def test_a_peer_on_another_host_sends_its_files_to_the_one_connection_with_the_token(monkeypatch):
    """serve/fetch_from on this machine over loopback: a wrong token gets nothing, the right one
    gets the files, and the copy is removed once bound."""
    import socket
    import secrets

    monkeypatch.setattr(peer_copy, "_ring_address", lambda rank: "127.0.0.1")
    ns: dict = {}
    exec("import math\nimport numpy as np\nw = np.arange(5.0)\nn = 3", ns)
    del ns["__builtins__"]
    name = _saved_folder(ns)
    try:
        token = secrets.token_hex(peer_copy.TOKEN_BYTES)
        offer = peer_copy.serve(name, 0, token, timeout=20)
        assert offer["host"] == "127.0.0.1"
        with socket.create_connection(("127.0.0.1", offer["port"]), 10) as wrong:
            wrong.sendall(b"x" * peer_copy.TOKEN_BYTES)
            assert wrong.recv(16) == b""   # closed, nothing sent
        new: dict = {}
        got = peer_copy.fetch_from(name, 0, "127.0.0.1", offer["port"], token, ["w", "n"], timeout=20)
        assert got["over"] == "network" and sorted(got["restored"]) == ["n", "w"], got
        assert not list(keep_files.keep_dir(name).glob("copy0.*"))
    finally:
        keep.discard(name, 0)


@pytest.mark.timeout(200)
def test_on_two_ssh_hosts_a_killed_rank_gets_its_peers_names_over_the_network(testbed):
    bed = testbed
    c = Cluster(n=1, hosts=bed.ips[:2], ssh_options=bed.ssh_options(), controller_ip=f"{bed.net}.1", timeout=30)
    try:
        c.start()
        after = _killed_then_next_step(c, 1)
        assert "; rank 1 died: 10 names restored from rank 0 over the network (MLP, X, Y, grad_fn, loss_fn, " \
               "losses, …) and its imports" in c.last_restart, c.last_restart
        assert after == _uninterrupted_next_step(c)
    finally:
        c.stop()


@pytest.mark.timeout(150)
def test_the_magics_restart_says_it_and_status_shows_where_each_ranks_names_came_from():
    from tests.cluster.kernel import Kernel

    k = Kernel()
    try:
        assert k.run("%load_ext mlx_jupyter\n%mlx_cluster start -n 3", 60).status == "ok"
        assert k.run("%%mlx_distributed\nimport os, time\nw = [1.5, 2]\nr = world.rank()", 30).status == "ok"
        died = k.run("%%mlx_distributed\nif world.rank() == 2:\n    os.kill(os.getpid(), 9)\ntime.sleep(30)", 30)
        assert died.status == "error" and "rank 2 died" in died.traceback, died
        res = k.run("%mlx_cluster restart", 90)
        assert res.status == "ok" and ("; rank 2 died: 1 name restored from rank 0 (w) and its imports; lost: r "
                                       "(it differs across ranks)") in res.stdout, res
        status = k.run("%mlx_cluster status", 10)
        [table] = [d["data"] for d in status.displays if "text/html" in d.get("data", {})]
        lines = [ln.rstrip() for ln in table["text/plain"].splitlines()]
        assert lines[0].split()[-3:] == ["names", "at", "restart"], lines
        assert lines[1].endswith("its own names") and lines[3].endswith("from rank 0 (1 name)"), lines
        back = k.run("%%mlx_distributed\nprint(w, 'r' in globals())", 30)
        assert "[ranks 0-1] [1.5, 2] True" in back.stdout and "[rank 2] [1.5, 2] False" in back.stdout, back
        assert k.run("%mlx_cluster restart --clean", 60).status == "ok"
        status = k.run("%mlx_cluster status", 10)
        [table] = [d["data"] for d in status.displays if "text/html" in d.get("data", {})]
        assert "names at restart" not in table["text/plain"], table
    finally:
        k.close()


def test_the_status_rows_and_the_panels_card_get_where_each_ranks_names_came_from():
    from types import SimpleNamespace

    from mlx_jupyter.cluster.restart_origins import status_column

    rows = [{"rank": 0}, {"rank": 1}]
    assert status_column(SimpleNamespace(restart_origins={0: "its own names", 1: "from rank 0 (3 names)"}), rows)
    assert rows == [{"rank": 0, "restart": "its own names"}, {"rank": 1, "restart": "from rank 0 (3 names)"}]
    assert not status_column(SimpleNamespace(), [{"rank": 0}])   # never restarted (or --clean): no column


def test_names_from_the_process_are_the_ranks_own_and_a_collective_that_agrees_everywhere_is_not():
    """``pid = os.getpid()`` was copied with the peer's value; ``losses.append(all_sum(loss).item())`` was
    dropped though the all_sum made it the same on every rank (issue 45 §8)."""
    cells = ["import os, socket\npid = os.getpid()\nhost = socket.gethostname()\nr = world.rank()",
             "losses, mine, mx_losses, parts = [], [], [], []\nfor i in range(3):\n"
             "    loss = f(X[r::2])\n    losses.append(mx.distributed.all_sum(loss, group=world).item() / 2)\n"
             "    mine.append(loss.item())\n    parts.append(mx.distributed.sum_scatter(loss))\n"
             "    mx_losses.append(dist.all_gather(loss))\n"
             "m = all_max(mine[-1])\nlabel = f'{pid}'"]
    assert peer_copy.rank_dependent(cells) == ["host", "label", "loss", "mine", "parts", "pid", "r"]
