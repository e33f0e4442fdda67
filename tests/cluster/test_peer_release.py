"""A rank that raises releases its peers blocked in MLX's collective, whichever client sent the cell.

Every test makes rank 1 raise (after a pause, so that rank 0 is inside MLX's ``all_sum`` on
``world`` waiting for it) and checks that the cell ends everywhere within 2 s of the raise, with
rank 1's error: ``%%mlx_distributed`` and ipyparallel's ``%%px`` in a real kernel, a notebook
connected to a cluster another process owns, and from plain Python ``Cluster.run``,
``Cluster.execute`` and ``cluster.view.execute`` (a real ipyparallel view). The raise time is
read from the error itself (``time.time()`` on rank 1); the end is when the client saw it.
Also: a raise must not stop a later, unrelated request, nor a rank running something else.
"""

from __future__ import annotations

import os
import re
import time
from datetime import datetime, timezone

import pytest

from mlx_jupyter import Cluster
from mlx_jupyter.cluster.rank import peers
from tests.cluster.kernel import Kernel

pytestmark = pytest.mark.timeout(240)

#: the promise of the issue: every rank's cell has ended this long after one raised (1.3 to 1.4 s
#: measured here on a quiet machine, most of it MLX's own retries on its shut sockets) ...
RELEASE_WITHIN = 2.0
#: ... plus this margin for a loaded machine: beside other test runs (load 19 on 2 cores) every path,
#: the notebook's own release included, took up to 2.5 s
LOAD_MARGIN = 1.0

#: rank 1 raises 0.5 s into the cell; rank 0 waits for it in MLX's all_sum meanwhile (the world was
#: formed at start: ``mx.distributed.init`` only returns it)
RAISING = """
import time
import mlx.core as mx
world = mx.distributed.init(backend='ring', strict=True)
if world.rank() == 1:
    time.sleep(0.5)
    raise ValueError(f'bad input on rank 1 at {time.time()!r}')
mx.distributed.all_sum(mx.ones(4), group=world).tolist()
"""


def raised_at(text: str) -> float:
    m = re.search(r"bad input on rank 1 at ([0-9.]+)", text)
    assert m, text
    return float(m.group(1))


def assert_released_in_time(text: str, ended: float) -> None:
    took = ended - raised_at(text)
    assert 0 <= took <= RELEASE_WITHIN + LOAD_MARGIN, \
        f"ended {took:.2f} s after rank 1 raised (promise: {RELEASE_WITHIN} s, + {LOAD_MARGIN} s for load)"


# ------------------------------------------------------------ which requests are one call


def key(date: float, code: str = "x", session: str = "s", ran: float = 0.01) -> dict:
    stamp = datetime.fromtimestamp(date, timezone.utc).isoformat().replace("+00:00", "Z")  # as ipyparallel sends it
    k = peers.request_key({"header": {"msg_type": "execute_request", "session": session, "date": stamp},
                           "content": {"code": code}})
    return {**k, "ran": ran}


def test_one_call_is_told_from_a_later_one_and_from_other_code():
    raiser = key(100.0, ran=0.2)
    assert peers.same_request(key(100.0001), raiser)            # sent in the same loop of the view
    assert peers.same_request(key(99.9999), raiser)             # sent just before it
    assert not peers.same_request(key(100.25), raiser)          # sent after the error came back: a later call
    assert not peers.same_request(key(100.0001, code="y"), raiser)
    assert not peers.same_request(key(100.0001, session="t"), raiser)
    assert not peers.same_request(key(98.0), raiser)            # an earlier call, long before


def test_a_notice_not_signed_with_the_clusters_key_is_dropped():
    got = []
    link = peers.PeerLink(0, [("127.0.0.1", 0), ("127.0.0.1", 1)], b"secret", lambda *a: got.append(a))
    try:
        forged = peers.PeerLink.__new__(peers.PeerLink)
        forged.key = b"other"
        body = b'{"from": 1, "key": {}, "error": "x", "t": 0, "nonce": "n"}'
        assert link._open(forged._sign(body) + b" " + body) is None
        assert link._open(link._sign(body) + b" " + body) is None  # signed, but stale
        fresh = body.replace(b'"t": 0', f'"t": {time.time()}'.encode())
        assert link._open(link._sign(fresh) + b" " + fresh)["error"] == "x"
        assert link._open(link._sign(fresh) + b" " + fresh) is None  # replayed
    finally:
        link.close()


# ------------------------------------------------------------ plain Python


@pytest.fixture(scope="module")
def cluster():
    c = Cluster(n=2, timeout=60).start()
    yield c
    c.stop()


@pytest.fixture
def fresh(cluster):
    """The cluster with a new MLX world (the last test's release shut it down)."""
    if any(row.get("world_closed") for row in cluster.status()):
        cluster.restart(clean=True)
    cluster.startup.wait_world(30)
    return cluster


def test_view_execute_ends_at_once_with_the_raising_ranks_error(fresh):
    from ipyparallel.error import CompositeError

    with pytest.raises(CompositeError) as err:
        fresh.view.execute(RAISING, block=True)
    ended = time.time()
    text = str(err.value)
    assert "[1:execute]ValueError: bad input on rank 1" in text, text
    assert "[0:execute]KeyboardInterrupt: stopped because rank 1 raised ValueError: bad input" in text, text
    assert_released_in_time(text, ended)
    assert fresh.status()[0]["world_closed"].startswith("rank 1 raised ValueError: bad input on rank 1")


def test_cluster_run_ends_at_once_naming_the_raising_rank(fresh):
    run = fresh.run(RAISING, init=False)
    assert run.wait(30)
    ended = time.time()
    assert run.first_error == 1
    assert_released_in_time(run.outcomes[1].evalue, ended)


def test_cluster_execute_returns_each_ranks_result_or_raises_one_error_naming_the_rank(fresh):
    from mlx_jupyter.cluster.cells.display import DistributedCellError

    assert fresh.execute("world.rank() * 10", timeout=30) == ["0", "10"]
    with pytest.raises(DistributedCellError) as err:
        fresh.execute(RAISING, timeout=30)
    ended = time.time()
    assert str(err.value).startswith("rank 1 raised ValueError: bad input on rank 1"), err.value
    assert_released_in_time(str(err.value), ended)


def test_cluster_execute_stops_the_ranks_after_its_timeout(fresh):
    from mlx_jupyter.cluster.cells.display import DistributedCellError

    t0 = time.monotonic()
    with pytest.raises(DistributedCellError, match="did not end within 1 s"):
        fresh.execute("import time\ntime.sleep(30)", timeout=1)
    assert time.monotonic() - t0 < 10


def test_a_raise_stops_no_later_request_and_no_rank_running_something_else(fresh):
    """A rank raising alone (its own request) leaves the others' requests running; one call per rank
    made after the error came back (a loop of blocking calls) is a later call: it runs."""
    from ipyparallel.error import RemoteError

    other = fresh.view.client[0].execute("import time\ntime.sleep(1.5)\ndone = 1", block=False)
    with pytest.raises(RemoteError):
        fresh.view.client[1].execute("raise ValueError('alone')", block=True)
    other.get(30)
    assert fresh.pull("done", targets=[0]) == [1]
    code = "import time\nfrom mlx_jupyter.cluster.rank import agent\nif agent.AGENT.rank == 1:\n" \
           "    raise ValueError('only rank 1')\ntime.sleep(0.5)\nafter = 1"
    with pytest.raises(RemoteError):
        fresh.view.client[1].execute(code, block=True)
    fresh.view.client[0].execute(code, block=True)   # same code, a later request: not stopped
    assert fresh.pull("after", targets=[0]) == [1]


# ------------------------------------------------------------ real kernels


@pytest.fixture(scope="module")
def kernel():
    k = Kernel()
    try:
        res = k.run("%load_ext mlx_jupyter\n%mlx_cluster start -n 2", timeout=120)
        assert res.status == "ok", res
        yield k
    finally:
        k.run("%mlx_cluster stop", timeout=60)
        k.close()


def fresh_world(k: Kernel) -> None:
    res = k.run("from mlx_jupyter import magics\n"
                "_c = magics.current()\n"
                "if any(r.get('world_closed') for r in _c.status()):\n"
                "    _c.restart(clean=True, quiet=True)\n"
                "_c.startup.wait_world(30)", timeout=120)
    assert res.status == "ok", res


def test_a_distributed_cell_ends_at_once_with_the_raising_ranks_error(kernel):
    fresh_world(kernel)
    res = kernel.run("%%mlx_distributed\n" + RAISING, timeout=60)
    ended = time.time()
    assert res.status == "error"
    assert "rank 1 raised ValueError: bad input on rank 1" in res.traceback, res.traceback
    assert_released_in_time(res.traceback, ended)


def test_ipyparallels_px_on_our_cluster_ends_at_once_with_the_raising_ranks_error(kernel):
    fresh_world(kernel)
    res = kernel.run("magics.current().view.activate()", timeout=30)
    assert res.status == "ok", res
    res = kernel.run("%%px\n" + RAISING, timeout=60)
    ended = time.time()
    assert res.status == "error"
    text = res.traceback + res.stdout + res.stderr
    assert "bad input on rank 1" in text, text
    assert_released_in_time(text, ended)


def test_a_connected_notebook_ends_at_once_with_the_raising_ranks_error(tmp_path):
    runtime = tmp_path / "runtime"
    runtime.mkdir()
    old = os.environ.get("JUPYTER_RUNTIME_DIR")
    os.environ["JUPYTER_RUNTIME_DIR"] = str(runtime)
    owner = Cluster(n=2, timeout=60).start()
    k = Kernel(env={"JUPYTER_RUNTIME_DIR": str(runtime)})
    try:
        owner.startup.wait_world(30)
        res = k.run(f"%load_ext mlx_jupyter\n%mlx_cluster connect {owner.cluster_id}", timeout=60)
        assert res.status == "ok", res
        res = k.run("%%mlx_distributed\n" + RAISING, timeout=60)
        ended = time.time()
        assert res.status == "error"
        assert "rank 1 raised ValueError: bad input on rank 1" in res.traceback, res.traceback
        assert_released_in_time(res.traceback, ended)
    finally:
        k.close()
        owner.stop()
        if old is None:
            os.environ.pop("JUPYTER_RUNTIME_DIR", None)
        else:
            os.environ["JUPYTER_RUNTIME_DIR"] = old
