"""A restart keeps the ranks' names: real ranks, real MLX, and for the magic a real kernel.

Values come back bit for bit (numpy float16/int64, MLX float32/bfloat16, torch, an nn.Module with
its optimizer, a dict of arrays, a plain object); one line names what was not kept and why;
``--clean`` starts empty; a name that fails to come back costs only itself; and after MLX's world
died on one rank's error, ``%mlx_cluster restart`` brings the state back with a working world.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from needs import require
from mlx_jupyter.cluster import Cluster, ClusterError
from mlx_jupyter.cluster.cells.display import DistributedCellError, show_run
from mlx_jupyter.cluster.kept_state import report_line
from mlx_jupyter.cluster.rank import keep, keep_files, keep_write
from tests.cluster.kernel import Kernel

pytestmark = pytest.mark.timeout(150)

BUILD = """
import numpy as np, torch, socket
import mlx.nn as nn, mlx.optimizers as optim
r = world.rank()
h = np.random.default_rng(r).standard_normal(1000).astype(np.float16)
i = np.arange(10 ** 6, dtype=np.int64) * (r + 3) - 2 ** 40
xf = mx.random.normal((64, 33), key=mx.random.key(r))
xb = (mx.random.normal((17, 5), key=mx.random.key(r + 9)) * 1e3).astype(mx.bfloat16)
t = torch.randn(4, 7, generator=torch.Generator().manual_seed(r))
tb = torch.randn(9, generator=torch.Generator().manual_seed(r + 1)).to(torch.bfloat16)
d = {"w": np.full(5, r, dtype=np.float32), "m": mx.ones((2, 2)) * r}

class Plain:
    def __init__(self, v):
        self.v = v

p = Plain([r, "x"])
model = nn.Linear(6, 3)
opt = optim.Adam(learning_rate=1e-2)
loss = lambda m, x: (m(x) ** 2).sum()
step = lambda: opt.update(model, nn.value_and_grad(model, loss)(model, mx.ones((2, 6)))[1])
step(); mx.eval(model.parameters(), opt.state)
gen = (k for k in range(3))
sock = socket.socket()
"""

#: each value as bytes and dtype, the same before and after
FINGERPRINT = """
import hashlib
def _fp(v):
    if isinstance(v, mx.array):
        raw = v.view(mx.uint16) if v.dtype == mx.bfloat16 else v
        return (str(v.dtype), v.shape, hashlib.sha1(np.array(raw).tobytes()).hexdigest())
    if isinstance(v, torch.Tensor):
        raw = v.view(torch.int16) if v.dtype == torch.bfloat16 else v
        return (str(v.dtype), tuple(v.shape), hashlib.sha1(raw.numpy().tobytes()).hexdigest())
    if isinstance(v, np.ndarray):
        return (str(v.dtype), v.shape, hashlib.sha1(v.tobytes()).hexdigest())
    return repr(v)
from mlx.utils import tree_flatten
fp = {k: _fp(globals()[k]) for k in ("h", "i", "xf", "xb", "t", "tb")}
fp.update({"d." + k: _fp(v) for k, v in d.items()})
fp.update({"model." + k: _fp(v) for k, v in tree_flatten(model.parameters())})
fp.update({"opt." + k: _fp(v) for k, v in tree_flatten(opt.state)})
fp["p"] = p.v
"""


def _keep_folders() -> set[str]:
    """The keep folders this test process's restarts made (another process's, of another test run or
    user on this machine, come and go meanwhile: issue 31 §5)."""
    return {p.name for p in keep.keep_root().glob("mlx-jupyter-keep-*")
            if (o := keep_files.owner_of(p.name)) is not None and o.pid == os.getpid()}


def _in_cell(folder: Path) -> str:
    """A cell line marking its rank as inside the cell: a file named after the rank in ``folder``."""
    return f"pathlib.Path({str(folder)!r}, str(world.rank())).touch()\n"


def _wait_in_cell(run, folder: Path, ranks: tuple[int, ...], timeout: float = 20.0) -> None:
    """Until each of ``ranks`` has run the :func:`_in_cell` line, the cell still running."""
    import time

    deadline = time.monotonic() + timeout
    while not all((folder / str(r)).exists() for r in ranks):
        assert time.monotonic() < deadline and not run.done.is_set(), f"the cell did not start on ranks {ranks}"
        run.done.wait(0.05)


def test_the_report_is_one_line_naming_what_was_not_kept_and_where():
    saved = {0: {"bytes": 2 ** 30, "not_kept": {"f": "a generator: cannot be pickled", "s": "a socket"}},
             1: {"bytes": 2 ** 30, "not_kept": {"s": "a socket"}}}
    restored = {0: {"restored": ["a", "b"], "failed": {}}, 1: {"restored": ["a", "b"], "failed": {"c": "boom"}}}
    line = report_line(saved, restored, {})
    assert line == ("restart: kept 2 names on 2 ranks (2.0 GiB); not kept: c on rank 1 (boom), "
                    "f on rank 0 (a generator: cannot be pickled), s (a socket)")
    assert "\n" not in line


def test_restart_brings_every_kind_of_value_back_bit_for_bit_and_clean_empties(capsys):
    before_folders = _keep_folders()
    with Cluster(n=2) as c:
        show_run(c.run(BUILD), timeout=60)
        show_run(c.run(FINGERPRINT), timeout=30)
        before = c.pull("fp")
        capsys.readouterr()
        c.restart(timeout=60)
        line = capsys.readouterr().out.strip()
        assert line.startswith("restart: kept ") and " on 2 ranks (" in line, line
        assert "gen (a generator: cannot be pickled)" in line and "sock (a socket)" in line, line
        assert "\n" not in line and c.last_restart == line
        show_run(c.run(FINGERPRINT), timeout=30)
        assert c.pull("fp") == before
        # modules came back by name, the model and its optimizer still train, `world` is new and works
        show_run(c.run("step(); mx.eval(model.parameters()); n = int(opt.state['step'])\n"
                       "s = mx.distributed.all_sum(mx.ones(2) * (r + 1), group=world).tolist()\n"
                       "z = np.zeros(1).tolist()"), timeout=30)
        assert c.pull("n") == [2, 2] and c.pull("s") == [[3.0, 3.0]] * 2 and c.pull("z") == [[0.0]] * 2
        assert _keep_folders() == before_folders  # removed after the restore
        c.restart(timeout=60, clean=True)
        show_run(c.run("gone = [k for k in ('h', 'model', 'opt', 'np') if k in globals()]"), timeout=30)
        assert c.pull("gone") == [[], []]
        assert c.last_restart == "restart: 2 ranks started empty (--clean)"


def test_a_name_that_fails_to_come_back_costs_only_itself():
    """A value whose restore raises on the new rank: the others come back, the line says which and
    why, the folder is gone and the cluster runs cells."""
    with Cluster(n=2) as c:
        show_run(c.run("class Fussy:\n    x = 0\n    def __init__(self):\n        self.x = 1\n    def __setstate__(self, state):\n        raise RuntimeError('no way back')\n"
                       "f = Fussy()\nkeepme = world.rank() * 10"), timeout=30)
        c.restart(timeout=60, quiet=True)
        assert ("not kept: f (could not be restored: RuntimeError: no way back)" in c.last_restart), c.last_restart
        assert c.pull("keepme") == [0, 10]
        show_run(c.run("s = mx.distributed.all_sum(mx.ones(1), group=world).item()"), timeout=30)
        assert c.pull("s") == [2.0, 2.0]


def test_a_users_own_handles_on_the_world_and_group_come_back_as_the_new_ones():
    """The usual idiom ``group = mx.distributed.init(...)``, a function using it and a dict holding our
    core's group come back holding the new rank's world and group; a split group is named, with the fix."""
    with Cluster(n=2) as c:
        show_run(c.run("import numpy as np, mlx_jupyter.distributed as dist\n"
                       "group = mx.distributed.init(backend='ring', strict=True)\n"
                       "total = lambda x: mx.distributed.all_sum(x, group=group)\n"
                       "mine = {'g': dist.init()}\n"
                       "alone = dist.init().split(world.rank())"), timeout=30)
        c.restart(timeout=60, quiet=True)
        line = c.last_restart
        assert "; group now holds MLX's new world" in line, line
        assert "alone (holds a group split from the old core group: split the new `group` again)" in line, line
        show_run(c.run("ok = [group is world, total(mx.ones(2) * (world.rank() + 1)).tolist(),\n"
                       "      mine['g'].size(), dist.all_sum(np.ones(1), group=mine['g']).tolist()]"), timeout=30)
        assert c.pull("ok") == [[True, [3.0, 3.0], 2, [2.0]]] * 2


def test_a_restart_stops_the_cells_still_running_first(tmp_path):
    """A --noblock cell still running when the restart comes is stopped as an interrupt would; a rank
    that does not stop (SIGINT blocked, as native code can be) loses its names, the others keep theirs."""
    with Cluster(n=2) as c:
        show_run(c.run("x = 41 + world.rank()"), timeout=30)
        run = c.run("import time, signal, pathlib\n"
                    "if world.rank() == 1:\n    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})\n"
                    + _in_cell(tmp_path) + "time.sleep(60)")
        _wait_in_cell(run, tmp_path, (0, 1))
        c.restart(timeout=60, quiet=True)
        assert run.done.is_set()
        line = c.last_restart
        assert line.startswith("restart: kept 4 names on 1 rank "), line   # x and the three modules
        assert "not kept: everything on rank 1 (it was still busy with a cell that did not stop" in line, line
        assert line.endswith("(after stopping the cell still running)"), line
        show_run(c.run("have = globals().get('x')"), timeout=30)
        assert c.pull("have") == [41, None]


@pytest.fixture
def small_and_big_roots(tmp_path, monkeypatch):
    """Two places to keep files: a 1 MiB tmpfs first (as a container's small /dev/shm), then a folder."""
    import subprocess

    from mlx_jupyter.cluster.rank import keep_files

    small, big = tmp_path / "shm", tmp_path / "tmp"
    small.mkdir()
    big.mkdir()
    if subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", str(small)], capture_output=True).returncode:
        require("a tmpfs mount", "needs to mount a tmpfs (root)")
    monkeypatch.setattr(keep_files, "keep_roots", lambda: [small, big])
    monkeypatch.setattr(keep, "keep_roots", lambda: [small, big])
    monkeypatch.setattr(keep_write, "keep_roots", lambda: [small, big])
    monkeypatch.setattr(keep_write, "MARGIN", 0)
    try:
        yield small, big
    finally:
        subprocess.run(["umount", str(small)], check=False)


def test_names_too_big_for_shared_memory_go_to_the_next_place(small_and_big_roots, monkeypatch):
    import numpy as np

    small, big = small_and_big_roots
    name = f"mlx-jupyter-keep-test-{os.getpid()}"
    ns = {"a": np.arange(2 ** 20, dtype=np.float32), "b": "small"}   # 4 MiB: more than the tmpfs holds
    answer = keep.save(name, 0, ns)
    assert answer["folder"] == str(big / name) and answer["kept"] == ["a", "b"]
    back: dict = {}
    assert sorted(keep.restore(name, 0, back)["restored"]) == ["a", "b"]
    assert (back["a"] == ns["a"]).all() and not (big / name).exists()
    # the estimate was low (the tmpfs looked roomy): the write that fills it up moves on, leaving nothing
    monkeypatch.setattr(keep_write, "free_bytes", lambda root: None)
    assert keep.save(name, 1, ns)["folder"] == str(big / name) and not (small / name).exists()
    keep.discard(name, 1)
    monkeypatch.setattr(keep, "keep_roots", lambda: [small])
    monkeypatch.setattr(keep_write, "keep_roots", lambda: [small])
    with pytest.raises(keep.NoRoom, match=r"no room for this rank's 4\.0 MiB of names \(.* filled up\): "
                                          "delete large names first, or restart with --clean"):
        keep.save(name, 2, ns)
    assert not (small / name).exists()


def test_a_rank_that_cannot_save_stops_the_restart_before_any_rank_is_lost():
    before = _keep_folders()
    with Cluster(n=2) as c:
        show_run(c.run("x = 41 + world.rank()\nimport os\npid = os.getpid()\n"
                       "if world.rank() == 1:\n"
                       "    import mlx_jupyter.cluster.rank.keep_write as k\n"
                       "    def full(*a):\n        raise k.NoRoom(28, 'no room for this rank (test)')\n"
                       "    k.SavedFiles.write_somewhere = full"), timeout=30)
        pids = c.pull("pid")
        with pytest.raises(ClusterError, match=r"saving the ranks' names failed \(rank 1: NoRoom: no room for this "
                                               r"rank \(test\)\); nothing was lost: the ranks were not restarted and "
                                               r"keep their names\. Next: restart again once the cause is gone "
                                               r"\(it keeps the names\), or "
                                               r"cluster\.restart\(clean=True\) to start the ranks empty"):
            c.restart(timeout=60, quiet=True)
        show_run(c.run("y = x + 1"), timeout=30)
        assert c.pull("pid") == pids and c.pull("y") == [42, 43]
        assert _keep_folders() == before   # rank 0's saved files were removed


def test_a_rank_that_died_comes_back_with_its_peers_names_and_imports():
    """Its names come from its live peer (test_restore_from_peers.py), but not ``x``: with one live
    rank nothing is compared, and a cell computed it from the rank's number; its imports (``np``) are
    redone there."""
    with Cluster(n=2) as c:
        show_run(c.run("import os, time, numpy as np\nx = world.rank()"), timeout=30)
        with pytest.raises(DistributedCellError, match="rank 1 died"):
            show_run(c.run("if world.rank() == 1:\n    os.kill(os.getpid(), 9)\ntime.sleep(30)"), timeout=30)
        c.restart(timeout=60, quiet=True)
        assert c.last_restart == (
            "restart: kept 4 names on 1 rank (21 B); rank 1 died: its imports restored from rank 0 "
            "(rank 0 was the only live rank, nothing to compare with: every name its cells did not compute from the "
            "rank's number or process was copied); lost: x (computed from the rank's number or process)"), c.last_restart
        show_run(c.run("ok = [np.ones(1).tolist(), os.getpid() > 0, globals().get('x')]"), timeout=30)
        assert c.pull("ok") == [[[1.0], True, 0], [[1.0], True, None]]


def test_a_rank_that_holds_its_gil_does_not_hold_the_restart_up(tmp_path):
    """Rank 1 sleeps in C with its GIL held (ctypes.PyDLL): it answers nothing, not even the control
    channel. The restart gives it the grace, then goes on without its names; rank 0 keeps its own."""
    with Cluster(n=2) as c:
        show_run(c.run("x = world.rank() + 5"), timeout=30)
        run = c.run("import ctypes, pathlib\n" + _in_cell(tmp_path)
                    + "if world.rank() == 1:\n    ctypes.PyDLL(None).sleep(600)")
        _wait_in_cell(run, tmp_path, (1,))
        c.restart(timeout=60, quiet=True)
        assert "everything on rank 1 (it was still busy with a cell that did not stop, or did not answer" \
            in c.last_restart, c.last_restart
        show_run(c.run("have = globals().get('x')"), timeout=30)
        assert c.pull("have") == [5, None]


def test_a_restart_stops_a_cell_another_client_runs(tmp_path, monkeypatch):
    """A connected notebook's cell (the owner does not track it) is stopped too, through the ranks'
    control channel: the names are saved at once, not after the cell (it would sleep 10 minutes)."""
    monkeypatch.setenv("JUPYTER_RUNTIME_DIR", str(tmp_path / "runtime"))
    with Cluster(n=2) as c:
        show_run(c.run("x = world.rank() + 7"), timeout=30)
        other = Cluster.connect(c.cluster_id, timeout=30)
        try:
            run = other.run("import time, pathlib\n" + _in_cell(tmp_path) + "time.sleep(600)")
            _wait_in_cell(run, tmp_path, (0, 1))
            c.restart(timeout=60, quiet=True)
        finally:
            other.stop()
        assert c.last_restart.endswith("(after stopping the cell still running)"), c.last_restart
        assert c.pull("x") == [7, 8]


def test_the_report_says_which_names_now_hold_the_new_world_or_group():
    saved = {r: {"bytes": 10, "renewed": {"group": "world", "g2": "world", "core": "group"}} for r in (0, 1)}
    restored = {r: {"restored": ["group", "g2", "core"], "failed": {}} for r in (0, 1)}
    assert report_line(saved, restored, {}) == ("restart: kept 3 names on 2 ranks (20 B); g2, group now hold "
                                                "MLX's new world; core now holds our core's new group")


def test_the_files_are_private_and_on_this_hosts_shared_memory(tmp_path):
    ns = {"a": __import__("numpy").arange(4)}
    name = f"mlx-jupyter-keep-test-{os.getpid()}"
    try:
        keep.save(name, 3, ns)
        folder = keep.keep_dir(name)
        assert folder.parent == (Path("/dev/shm") if Path("/dev/shm").is_dir() else Path(__import__("tempfile").gettempdir()))
        assert folder.stat().st_mode & 0o777 == 0o700
        assert all(f.stat().st_mode & 0o777 == 0o600 for f in folder.iterdir())
        back: dict = {}
        keep.restore(name, 3, back)
        assert (back["a"] == ns["a"]).all() and not folder.exists()
        folder.mkdir(mode=0o755)   # made by someone else, or readable by others: never read
        folder.chmod(0o755)
        with pytest.raises(PermissionError, match="not a private folder"):
            keep.save(name, 3, ns)
        with pytest.raises(PermissionError, match="not a private folder"):
            keep.restore(name, 3, {})
    finally:
        keep.remove_all(name)


def test_after_mlxs_world_died_the_magics_restart_brings_the_state_and_a_working_world_back():
    """Rank 1 raises after building an all_gather while rank 0 waits in an all_sum of the same number (no drain can make it):
    the world is dead; `%mlx_cluster restart`
    keeps `model` and the data, and MLX's `world` sums correctly again."""
    k = Kernel()
    try:
        assert k.run("%load_ext mlx_jupyter\n%mlx_cluster start -n 2", 60).status == "ok"
        built = k.run("%%mlx_distributed\nimport mlx.nn as nn\nimport numpy as np\nmodel = nn.Linear(3, 2)\n"
                      "data = np.arange(6.0) + world.rank()\nw = np.array(model.weight).tolist()", 60)
        assert built.status == "ok", built
        died = k.run("%%mlx_distributed\nimport mlx_jupyter.distributed as d\nd.init().barrier()\n"
                     "if world.rank() == 1:\n    g = mx.distributed.all_gather(mx.ones(5), group=world)\n    1/0\n"
                     "mx.eval(mx.distributed.all_sum(mx.ones(3), group=world))", 60)
        assert died.status == "error" and "%mlx_cluster restart" in died.stdout + died.traceback, died
        refused = k.run("%%mlx_distributed\nmx.distributed.all_sum(mx.ones(2), group=world)", 30)
        assert "MLX's `world` is shut down" in refused.stdout + refused.traceback, refused
        restarted = k.run("%mlx_cluster restart", 90)
        assert restarted.status == "ok", restarted
        assert "restart: kept " in restarted.stdout and "on 2 ranks" in restarted.stdout, restarted.stdout
        assert "heart" not in (restarted.stdout + restarted.stderr).lower(), restarted   # the controller's log stays its own
        after = k.run("%%mlx_distributed\nprint('sum', mx.distributed.all_sum(mx.ones(2) * (world.rank() + 1), "
                      "group=world).tolist(), data.tolist()[:2], np.array(model.weight).tolist() == w)", 60)
        assert after.status == "ok", after
        assert "sum [3.0, 3.0] [0.0, 1.0] True" in after.stdout and "sum [3.0, 3.0] [1.0, 2.0] True" in after.stdout, \
            after.stdout
        assert k.run("%mlx_cluster stop", 30).status == "ok"
    finally:
        k.close()


def _dead_owner_folder() -> str:
    """A restart folder as a kernel killed in the middle of a restart left it on this host."""
    import subprocess
    import sys

    from mlx_jupyter.cluster.rank import keep_files

    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    owner = keep_files.Owner(keep_files.host_tag(), gone.pid, keep_files.process_started(gone.pid) or 1)
    gone.wait(10)
    name = keep_files.folder_name("mlx-stale", "ab" * 8, owner)
    keep_files.private_dir(keep_files.keep_root() / name, create=True)
    (keep_files.keep_root() / name / "rank0.data").write_bytes(b"x" * 64)
    return name


def test_folders_name_their_owner_and_only_a_gone_owners_are_swept():
    from mlx_jupyter.cluster.rank import keep_files

    stale, live = _dead_owner_folder(), keep_files.folder_name("mlx-live", "cd" * 8)
    keep_files.private_dir(keep_files.keep_root() / live, create=True)
    try:
        assert keep_files.owner_of(live) == keep_files.this_owner()
        elsewhere = keep_files.folder_name("mlx-x", "ef" * 8, keep_files.Owner(keep_files.host_tag("other"), 1, 5))
        assert not keep_files.owner_gone(keep_files.owner_of(elsewhere))   # another host's: not judged here
        assert keep_files.owner_of("mlx-jupyter-keep-../../etc") is None
        assert keep_files.sweep_stale() == [stale]
        assert {stale, live} & set(keep_files.folders_here()) == {live}
    finally:
        keep_files.remove_all(stale)
        keep_files.remove_all(live)


def test_a_restart_whose_new_ranks_fail_leaves_no_files_and_says_what_was_lost_and_what_next():
    """Saved, then the new ranks cannot start: the files are removed, the error says what was lost
    and what to do, and doing it works. A folder a killed kernel left is swept at the start."""
    stale = _dead_owner_folder()
    before = _keep_folders() - {stale}
    with Cluster(n=2) as c:
        assert not (keep.keep_root() / stale).exists()   # swept when the cluster started
        show_run(c.run("import numpy as np\nv = np.arange(5)"), timeout=30)
        launcher = c.processes.ipp.config.MLXEngineSetLauncher
        good, launcher.python = launcher.python, "/nonexistent/python3"
        with pytest.raises(ClusterError) as failed:
            c.restart(timeout=30)
        msg = str(failed.value)
        assert msg.startswith("starting the new ranks failed (rank 0 on 127.0.0.1: command "
                              "'/nonexistent/python3' not found"), msg
        assert "lost: the 2 names saved on 2 ranks (" in msg and "the saved files were removed" in msg, msg
        assert msg.endswith("Next: fix the cause, then cluster.restart() (the ranks start empty), "
                            "or cluster.stop() and cluster.start()"), msg
        assert _keep_folders() == before
        launcher.python = good
        c.restart(timeout=60, quiet=True)   # what the message said
        assert c.last_restart == "restart: 2 ranks started empty (no rank was running to keep names from)"
        show_run(c.run("s = mx.distributed.all_sum(mx.ones(1), group=world).item()\nhas_v = 'v' in globals()"),
                 timeout=30)
        assert c.pull("s") == [2.0, 2.0] and c.pull("has_v") == [False, False]


def test_an_interrupt_or_a_failed_restore_leaves_no_files(capsys):
    """Ctrl-C after the new ranks started (before the restore), and a restore that raises on every
    rank: no file is left on either path, and each says what was kept and lost."""
    from mlx_jupyter.cluster.kept_state import restart_keeping

    before = _keep_folders()
    with Cluster(n=2) as c:
        show_run(c.run("w = world.rank() + 1"), timeout=30)

        def fresh_then_interrupted() -> None:
            c.namespaces.forget()
            c.processes.restart(None, 60)
            raise KeyboardInterrupt

        with pytest.raises(KeyboardInterrupt):
            restart_keeping(c, fresh_then_interrupted)
        err = capsys.readouterr().err
        assert "interrupted while starting the new ranks; lost: the 1 name saved on 2 ranks" in err, err
        assert _keep_folders() == before
        show_run(c.run("w = world.rank() + 1"), timeout=30)

        def fresh_with_an_unusable_folder() -> None:
            c.namespaces.forget()
            c.processes.restart(None, 60)
            for folder in keep.keep_root().glob("mlx-jupyter-keep-*"):
                if folder.name not in before:
                    folder.chmod(0o755)   # the new ranks refuse it: their restore raises before reading

        line = restart_keeping(c, fresh_with_an_unusable_folder)
        assert "everything on rank 0 (restoring failed: PermissionError" in line, line
        assert _keep_folders() == before
        show_run(c.run("has_w = 'w' in globals()"), timeout=30)
        assert c.pull("has_w") == [False, False]
