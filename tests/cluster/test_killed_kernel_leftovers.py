"""What a SIGKILLed kernel's cluster leaves (issue 44 §4): its state record in /dev/shm, its registry
entry and its controller's key files go at the next start; no process of it outlives the kernel."""

from __future__ import annotations

import glob
import json
import os
import signal
import time

import psutil
import pytest

from tests.cluster.kernel import Kernel, alive, kill_leftovers

pytestmark = pytest.mark.timeout(180)


def _until(check, timeout: float, what: str):
    """``check()``'s first true answer within ``timeout`` s (a readiness probe), else fail naming ``what``."""
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        got = check()
        if got:
            return got
        time.sleep(0.05)
    pytest.fail(f"{what} within {timeout} s")


def test_the_next_start_removes_what_a_sigkilled_kernels_cluster_left(tmp_path, monkeypatch):
    monkeypatch.setenv("JUPYTER_RUNTIME_DIR", str(tmp_path))
    from mlx_jupyter import Cluster
    from mlx_jupyter.cluster import registry
    from mlx_jupyter.cluster.rank import keep_files

    k = Kernel(env={"JUPYTER_RUNTIME_DIR": str(tmp_path)})
    tree: list[int] = []
    try:
        res = k.run("%load_ext mlx_jupyter\n%mlx_cluster start -n 2 --record-state", timeout=120)
        assert res.status == "ok", res
        res = k.run("%%mlx_distributed\nimport numpy as np\nweights = np.ones(1 << 16)", timeout=60)
        assert res.status == "ok", res
        res = k.run("import json\nfrom mlx_jupyter import magics\nc = magics.current()\n"
                    "print(json.dumps([c.cluster_id, c.records.dirname, c.records.describe(c, wait=30)[0]['on']]))",
                    timeout=60)
        assert res.status == "ok", res
        cluster_id, record, on = json.loads(res.stdout.strip().splitlines()[-1])
        assert on
        # the controller runs in a session of its own (not the kernel's child): its watchdog ends it
        controller = registry.entry(cluster_id)["controller_pid"]
        tree = sorted({p.pid for p in psutil.Process(k.pid).children(recursive=True)} | {controller})
        security = os.path.join(registry.profile_dir(), "security")
        keys = sorted(glob.glob(os.path.join(security, f"*{cluster_id}*.json")))
        assert len(keys) == 3, keys   # ipcontroller-<id>-client/-engine.json, cluster-<id>.json
        assert registry.entry(cluster_id) is not None and record in keep_files.folders_here()
        os.kill(k.pid, signal.SIGKILL)
        k.km.provisioner.process.wait(10)   # reaped, as the Jupyter server reaps its kernels
        _until(lambda: not alive(tree), 10, "every process of the killed kernel's cluster ended")
        # what the SIGKILL left until this change's sweep: the entry, the key files, the record
        assert registry.entry(cluster_id) is not None and all(os.path.exists(p) for p in keys)
        assert record in keep_files.folders_here()

        c = Cluster(n=1, timeout=60).start()
        try:
            assert registry.entry(cluster_id) is None, "the dead kernel's registry entry is still there"
            assert [p for p in keys if os.path.exists(p)] == [], "its controller's key files are still there"
            assert record not in keep_files.folders_here(), "its state record is still there"
            assert registry.entry(c.cluster_id) is not None   # the live cluster's own are kept
            assert glob.glob(os.path.join(security, f"ipcontroller-{c.cluster_id}-*.json"))
        finally:
            c.stop()
    finally:
        k.close()
        kill_leftovers(tree)


def test_an_entry_whose_owner_pid_was_reused_is_swept_and_a_live_owners_is_kept(tmp_path, monkeypatch):
    """The owner's pid names a live process (this test's) with another start: the owner is gone."""
    monkeypatch.setenv("JUPYTER_RUNTIME_DIR", str(tmp_path))
    from mlx_jupyter.cluster import registry
    from mlx_jupyter.proc_identity import start_token

    base = registry.folder()
    base.mkdir(parents=True)
    me, started = os.getpid(), start_token(os.getpid())
    entries = {"mlx-reused": {"id": "mlx-reused", "owner_pid": me, "owner_start": "1",
                              "controller_pid": me, "controller_start": "1"},
               "mlx-live": {"id": "mlx-live", "owner_pid": me, "owner_start": started,
                            "controller_pid": me, "controller_start": started}}
    security = os.path.join(registry.profile_dir(), "security")
    for cid, data in entries.items():
        (base / f"{cid}.json").write_text(json.dumps(data))
        for end in ("client", "engine"):
            open(os.path.join(security, f"ipcontroller-{cid}-{end}.json"), "w").close()
    assert registry.sweep() == ["mlx-reused"]
    assert registry.entry("mlx-reused") is None and registry.entry("mlx-live") is not None
    assert sorted(os.listdir(security)) == ["ipcontroller-mlx-live-client.json", "ipcontroller-mlx-live-engine.json"]
