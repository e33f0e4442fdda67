"""Our clusters stay out of ipyparallel's own lab panel: their files are in a profile of ours, not $IPYTHONDIR."""

from __future__ import annotations

import glob
import os

import ipyparallel as ipp
from IPython.core.profiledir import ProfileDir
import pytest

from mlx_jupyter.cluster import Cluster, registry

pytestmark = pytest.mark.timeout(90)


def test_ipyparallels_cluster_manager_does_not_list_ours(tmp_path, monkeypatch):
    monkeypatch.setenv("IPYTHONDIR", str(tmp_path / "ipython"))
    monkeypatch.setenv("JUPYTER_RUNTIME_DIR", str(tmp_path / "runtime"))
    (tmp_path / "ipython").mkdir()
    ProfileDir.create_profile_dir_by_name(str(tmp_path / "ipython"), "default")
    with Cluster(n=2, timeout=60) as cluster:
        ours = glob.glob(os.path.join(registry.profile_dir(), "security", f"cluster-{cluster.cluster_id}.json"))
        assert ours, "ipyparallel's cluster file is not in our profile"
        assert registry.profile_dir().startswith(str(tmp_path / "runtime"))
        listed = ipp.ClusterManager().load_clusters()  # what ipyparallel's panel lists: every $IPYTHONDIR profile
        assert not [key for key in listed if cluster.cluster_id in key], listed
        assert cluster.pull("__name__") == ["__main__", "__main__"]
