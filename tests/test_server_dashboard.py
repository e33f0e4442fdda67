"""The dashboard's data: per-rank series in a bounded ring (rates from the core's op counters), the
dashboard endpoint's cluster with its series and last profile, owners in words, the form's schema."""

from __future__ import annotations

import asyncio
import json

import pytest

from mlx_jupyter.server.history import ClusterHistory
from mlx_jupyter.server.owners import label_owner
from mlx_jupyter.server.requests import SCHEMA, RequestError, form_fields, parse_start
from mlx_jupyter.vocab.hosts import BOTH_HOST_SOURCES
from tests.security.server_process import JupyterServer


def sample(seq: int, nbytes: int = 4096, cpu: float = 1.0, rss: int = 100, group: str = "core:1") -> dict:
    return {"cpu": cpu, "rss": rss, "ops": [[group, seq, nbytes]]}


def test_rates_come_from_the_counters_change_between_two_points():
    h = ClusterHistory(min_gap=0.9)
    assert h.add(100.0, {0: sample(5), 1: sample(5)}) == 2
    assert h.add(100.5, {0: sample(9)}) == 0          # sooner than min_gap: no point, counters kept
    assert h.add(102.0, {0: sample(25), 1: sample(5)}) == 2
    s = h.series()["ranks"]
    assert s["0"]["t"] == [100.0, 102.0] and s["0"]["ops"] == [None, 10.0] and s["0"]["bytes"] == [None, 40960]
    assert s["1"]["ops"] == [None, 0.0] and s["0"]["cpu"] == [1.0, 1.0] and s["0"]["memory"] == [100, 100]
    assert h.series(since=100.0)["ranks"]["0"]["t"] == [102.0]


def test_a_new_group_counts_from_zero_and_a_reformed_one_from_zero_again():
    h = ClusterHistory(min_gap=0)
    h.add(0.0, {0: sample(10)})
    h.add(1.0, {0: {"ops": [["core:1", 12, 8], ["core:2", 3, 100]]}})
    assert h.series()["ranks"]["0"]["ops"][-1] == 5.0 and h.series()["ranks"]["0"]["bytes"][-1] == 2 * 8 + 300
    h.add(2.0, {0: {"ops": [["core:1", 2, 8]]}})        # count went down: the group was formed again
    assert h.series()["ranks"]["0"]["ops"][-1] == 2.0
    assert h.series()["ranks"]["0"]["cpu"][-1] is None  # a sample without CPU: a gap, not 0


def test_the_ring_keeps_the_last_window_points_and_forgets_ranks_gone():
    h = ClusterHistory(window=5, min_gap=0)
    for t in range(12):
        h.add(float(t), {0: sample(t), 1: sample(t)})
    assert h.series()["ranks"]["0"]["t"] == [7.0, 8.0, 9.0, 10.0, 11.0] and h.series()["window"] == 5
    h.forget({0})
    assert list(h.series()["ranks"]) == ["0"]


def test_garbage_counters_are_skipped():
    h = ClusterHistory(min_gap=0)
    h.add(0.0, {0: {"ops": [["core:1", 1, 1], "x", [1, 2]]}})
    h.add(1.0, {0: {"ops": [["core:1", 3, 1], None]}})
    assert h.series()["ranks"]["0"]["ops"] == [None, 2.0]


def test_mlxs_own_collectives_are_columns_of_their_own_from_totals_that_never_restart():
    """Issue 45 §1: a sample's ``mlx_ops`` (calls per MLX group and their inputs' bytes since the rank recorded them)
    gives mlx_ops and mlx_bytes per second beside our core's; a rank without MLX's record has none (a gap)."""
    def mlx(world: int, split: int, nbytes: int) -> dict:
        return {"ops": [["core:1", 4, 8]], "mlx_ops": {"calls": {"world": world, "world/0": split}, "bytes": nbytes}}

    h = ClusterHistory(min_gap=0)
    h.add(0.0, {0: mlx(100, 0, 409600), 1: {"ops": []}})
    h.add(2.0, {0: mlx(300, 100, 2 * 409600 + 100 * 16), 1: {"ops": []}})
    h.add(3.0, {0: mlx(50, 0, 4096), 1: {"ops": []}})   # lower totals: a new process, counted from 0
    s = h.series()["ranks"]
    assert s["0"]["mlx_ops"] == [None, 150.0, 50.0] and s["0"]["mlx_bytes"] == [None, 205600, 4096]
    assert s["0"]["ops"] == [None, 0.0, 0.0], "our core's count is its own"
    assert s["1"]["mlx_ops"] == [None, None, None] and s["1"]["mlx_bytes"] == [None, None, None]


class Fake:
    """A running cluster's status and where answers, as Cluster gives them."""

    backend, hosts, hostfile, size = "ring", ["127.0.0.1"], None, 2

    def __init__(self, **kw):
        self.cluster_id = "mlx-dash"
        self.seq = 0
        self.last_restart = "restart: kept 3 names on 2 ranks"
        self.restart_origins = {0: "its own names", 1: "from rank 0 (3 names)"}

    def start(self, progress=None):
        progress(2, 2)

    def stop(self):
        pass

    def status(self, timeout=1.0):
        return [{"rank": r, "host": "127.0.0.1", "pid": 100 + r, "state": "busy" if r == 0 else "idle",
                 "memory": 2**20} for r in range(2)]

    def where_samples(self, ranks=None, timeout=1.0):
        self.seq += 10
        return {0: {"rank": 0, "running": True, "cpu": 50.0, "rss": 2**21, "line": 3, "source": "x = 1",
                    "activity": [], "ops": [["core:1", self.seq, 1024]]},
                1: {"rank": 1, "running": False, "cpu": 0.5, "rss": 0, "ops": [["core:1", self.seq, 1024]]}}


def test_the_dashboard_endpoint_gives_the_cluster_its_series_restart_origins_and_last_profile(tmp_path, monkeypatch):
    monkeypatch.setenv("JUPYTER_RUNTIME_DIR", str(tmp_path))
    from mlx_jupyter.cluster import last_profile
    from mlx_jupyter.server.manager import ClusterManager

    async def go():
        m = ClusterManager(factory=Fake)
        entry = await m.create(n=2, hosts="127.0.0.1", backend="ring")
        await m.start(entry)
        entry.live.history = ClusterHistory(min_gap=0)
        first = await m.dashboard("mlx-dash")
        assert first["profile"] is None and first["owner_text"] == "started from this panel"
        last_profile.save("mlx-dash", "<svg/>", "20 op records on 2 ranks", [0, 1])
        second = await m.dashboard("mlx-dash", since=first["series"]["ranks"]["0"]["t"][-1])
        assert await m.dashboard("mlx-none") is None
        m.shutdown()
        return first, second

    first, second = asyncio.run(go())
    assert [r["where"] for r in first["ranks"]] == ["running line 3: x = 1", "idle"]
    assert [r["restart"] for r in first["ranks"]] == ["its own names", "from rank 0 (3 names)"]
    assert first["restart_report"] == "restart: kept 3 names on 2 ranks"
    assert first["series"]["ranks"]["1"]["memory"] == [2**20]   # the status row's memory where the sample has none
    ranks = second["series"]["ranks"]
    assert len(ranks["0"]["t"]) == 1 and ranks["0"]["ops"][0] > 0 and ranks["0"]["cpu"] == [50.0]
    assert second["profile"]["svg"] == "<svg/>" and second["profile"]["ranks"] == [0, 1]


def test_kernels_clusters_say_alive_and_what_they_do_and_whose_they_are(tmp_path, monkeypatch):
    monkeypatch.setenv("JUPYTER_RUNTIME_DIR", str(tmp_path))
    import os

    from mlx_jupyter.cluster import registry
    from mlx_jupyter.server.manager import ClusterManager

    folder = registry.folder()
    folder.mkdir(parents=True)
    (folder / "mlx-k.json").write_text(json.dumps({
        "id": "mlx-k", "owner": "kernel", "owner_pid": os.getpid(), "backend": "ring", "hosts": ["127.0.0.1"],
        "size": 2, "busy": [1], "ranks": [{"rank": r, "host": "127.0.0.1", "pid": os.getpid()} for r in range(2)]}))

    async def mine():
        return {os.getpid(): "status.ipynb"}

    async def nobody():
        return {}

    [item] = asyncio.run(ClusterManager(kernel_pids=mine, watched=Unreachable()).listing())
    assert [(r["health"], r["state"]) for r in item["ranks"]] == [("ok", "idle"), ("ok", "running a cell")]
    assert item["state"] == "running" and item["owner_kind"] == "notebook"
    assert item["owner_text"] == f"started by status.ipynb (kernel pid {os.getpid()})"
    [item] = asyncio.run(ClusterManager(kernel_pids=nobody, watched=Unreachable()).listing())
    assert item["owner_kind"] == "other" and item["owner_text"] == f"another process's cluster (pid {os.getpid()})"
    # no handle on its controller yet (made off the listing's path): no points, and nothing asked of the ranks
    assert asyncio.run(ClusterManager(kernel_pids=nobody, watched=Unreachable()).dashboard("mlx-k"))["series"]["ranks"] == {}


class Unreachable:
    """No handle on any cluster: as the server's watch before (or without) its connection."""

    def keep(self, ids):
        pass

    def samples(self, entry, timeout):
        return None

    def live(self, cluster_id):
        return None

    def close(self):
        pass


def test_label_owner_without_the_servers_kernels_names_the_pid():
    assert label_owner({"owner_pid": 7}, None) == {"owner_kind": "notebook", "owner_text": "started by kernel pid 7"}


def test_the_forms_fields_are_the_requests_fields_and_its_limits_are_the_checks():
    fields = {f["name"]: f for f in form_fields()}
    assert set(fields) == set(SCHEMA["properties"])
    n = fields["n"]
    parse_start(json.dumps({"n": n["max"]}).encode())
    with pytest.raises(ValueError, match=r"^n: ranks per host: an integer from 1 to 64$"):
        parse_start(json.dumps({"n": n["max"] + 1}).encode())
    for choice in fields["backend"]["choices"]:
        parse_start(json.dumps({"backend": choice}).encode())
    assert all(f["label"] and f["help"] for f in fields.values())


def test_a_start_request_with_hosts_and_a_hostfile_names_the_hostfile_field_in_the_one_wording():
    with pytest.raises(RequestError) as err:
        parse_start(json.dumps({"hosts": "a,b", "hostfile": "/h.json"}).encode())
    assert err.value.field == "hostfile" and str(err.value) == f"hostfile: {BOTH_HOST_SOURCES}"


@pytest.mark.timeout(90)
def test_the_endpoints_through_a_real_server(tmp_path):
    """GET schema and clusters/<id>/dashboard mounted on jupyter_server: the form's fields, 404 for no cluster,
    400 naming ``since`` when it is not a time."""
    with JupyterServer(tmp_path, tmp_path) as server:
        def get(path: str) -> tuple[int, dict]:
            return server.request("GET", f"/mlx-jupyter/{path}", timeout=5)

        assert get("schema") == (200, {"fields": form_fields()})
        assert get("clusters/mlx-none/dashboard") == (404, {"error": "no cluster mlx-none"})
        status, body = get("clusters/mlx-none/dashboard?since=soon")
        assert status == 400 and body["field"] == "since"


def test_points_taken_within_10_ms_keep_distinct_times_so_a_reader_since_the_first_gets_the_second():
    h = ClusterHistory(min_gap=0)
    sample = {0: {"cpu": 1.0, "rss": 2**20, "ops": [["core:1", 1, 8]]}}
    h.add(100.001, sample)
    h.add(100.004, sample)   # rounds to the same 100.0
    t = h.series()["ranks"]["0"]["t"]
    assert t == [100.0, 100.01], t
    assert h.series(since=100.0)["ranks"]["0"]["t"] == [100.01]
