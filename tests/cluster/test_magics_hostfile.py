"""`%mlx_cluster start --hostfile`: a hostfile with the fields MLX ignores starts real ranks with one
warning naming them; a hostile one is a UsageError naming the file, never a traceback or a hang
(issues 31 §4, 35 §1). Real ranks on this machine; no kernel (the magics run in this process)."""

from __future__ import annotations

import json
import os

import pytest

from mlx_jupyter import magics
from mlx_jupyter.magics import UsageError

pytestmark = pytest.mark.timeout(120)


@pytest.fixture
def magic(monkeypatch):
    monkeypatch.setattr(magics, "_cluster", None)
    m = magics.MLXMagics(shell=None)
    yield m
    if magics.current() is not None:
        m.mlx_cluster("stop")


def test_unknown_fields_start_real_ranks_with_one_warning(magic, tmp_path, capfd):
    hf = tmp_path / "h.json"
    hf.write_text(json.dumps({"note": "rack 3", "backend": "ring", "envs": ["FROM_FILE=yes"], "hosts": [
        {"ssh": "127.0.0.1", "ips": ["127.0.0.1"], "comment": "the left one"}]}))
    magic.mlx_cluster(f"start -n 2 --hostfile {hf} --timeout 60")
    cluster = magics.current()
    assert (cluster.size, cluster.backend) == (2, "ring")
    run = cluster.run("import os; v = os.environ.get('FROM_FILE')", [0, 1])
    run.wait(30)
    assert cluster.pull("v", [0, 1]) == ["yes", "yes"]
    err = capfd.readouterr().err
    warnings = [line for line in err.splitlines() if "unknown field" in line]
    assert warnings == [f"mlx-jupyter: hostfile {str(hf)!r}: ignored unknown field(s) 'note' (top level), "
                        "'comment' (host 0), as MLX ignores them (a hostfile's fields: backend, envs, hosts; "
                        "a host's: ssh, ips, rdma)"], err


@pytest.mark.parametrize("kind, message", [
    ("deep", "not a hostfile (nested deeper than 32 levels)"),
    ("fifo", "is not a regular file"),
    ("typo", "unknown field 'ip': did you mean 'ips'?"),
])
def test_a_hostile_hostfile_is_a_usage_error_naming_it(magic, tmp_path, kind, message):
    hf = tmp_path / "h.json"
    if kind == "fifo":
        os.mkfifo(hf)   # nobody writes it
    else:
        hf.write_text("[" * 100000 if kind == "deep" else json.dumps([{"ssh": "127.0.0.1", "ip": []}]))
    with pytest.raises(UsageError) as exc:
        magic.mlx_cluster(f"start --hostfile {hf}")
    assert str(exc.value).startswith(f"--hostfile {hf}: hostfile {str(hf)!r}") and message in str(exc.value)
    assert magics.current() is None
