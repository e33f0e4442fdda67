"""`mlx-jupyter launch --hostfile`, end to end: a hostfile with the fields MLX ignores starts real
ranks with one warning naming them; a hostile one (nested, a FIFO, huge) is one line, never a
traceback or a hang (issues 31 §4, 35 §1). The other entry points: tests/topology/test_config_cli.py,
tests/cluster/test_magics_hostfile.py, tests/security/test_server_hostfile.py."""

from __future__ import annotations

import json
import os

import pytest

from launch_helpers import PY, cli

pytestmark = pytest.mark.timeout(120)
SHOW_RANK = "import os; print('rank', os.environ['MLX_RANK'], os.environ.get('FROM_FILE'))"


def test_unknown_fields_are_ignored_with_one_warning_and_the_ranks_run(tmp_path, port_block):
    hf = tmp_path / "h.json"
    hf.write_text(json.dumps({"note": "rack 3", "backend": "ring", "envs": ["FROM_FILE=yes"], "hosts": [
        {"ssh": "127.0.0.1", "ips": ["127.0.0.1"], "comment": "the left one"}]}))
    res = cli(["--hostfile", str(hf), "-n", "2", "-p", str(port_block(2)), "--output", "raw", PY, "-c", SHOW_RANK])
    assert res.returncode == 0, res.stderr
    assert sorted(res.stdout.split("\n")[:2]) == ["rank 0 yes", "rank 1 yes"], res.stdout
    warnings = [line for line in res.stderr.splitlines() if "unknown field" in line]
    assert warnings == [f"mlx-jupyter launch: hostfile {str(hf)!r}: ignored unknown field(s) 'note' (top level), "
                        "'comment' (host 0), as MLX ignores them (a hostfile's fields: backend, envs, hosts; "
                        "a host's: ssh, ips, rdma)"], res.stderr


def test_a_typo_of_a_known_field_is_refused(tmp_path):
    hf = tmp_path / "h.json"
    hf.write_text(json.dumps([{"ssh": "127.0.0.1", "ip": ["127.0.0.1"]}]))
    res = cli(["--hostfile", str(hf), "--", "true"])
    assert res.returncode == 2
    assert res.stderr == (f"mlx-jupyter launch: error: hostfile {str(hf)!r}: host 0 (rank 0): unknown field 'ip': "
                          "did you mean 'ips'? (the fields are ssh, ips, rdma; others are ignored)\n")


@pytest.mark.parametrize("kind, message", [
    ("deep", "not a hostfile (nested deeper than 32 levels)"),
    ("fifo", "is not a regular file (a FIFO, a device or a directory?); give a JSON file"),
    ("huge", "is larger than 1024 KiB: not a hostfile"),
])
def test_a_hostile_hostfile_is_one_line_never_a_traceback_or_a_hang(tmp_path, kind, message):
    hf = tmp_path / "h.json"
    if kind == "fifo":
        os.mkfifo(hf)   # nobody ever writes it: a blocking open would hang the launcher for good
    else:
        hf.write_text("[" * 100000 if kind == "deep" else " " * (50 << 20))
    res = cli(["--hostfile", str(hf), "--", "true"], timeout=30)
    assert res.returncode == 2
    assert res.stderr.startswith(f"mlx-jupyter launch: error: hostfile {str(hf)!r}") and message in res.stderr
    assert len(res.stderr.splitlines()) == 1, res.stderr


def test_hosts_and_a_hostfile_together_run_the_hostfile_as_mlx_launch_does_and_say_so(tmp_path, port_block):
    """The launch CLI follows mlx.launch (the hostfile wins), in one line naming what is not used; every other
    entry point refuses both (tests/cluster/test_cluster_api.py, test_magics_args.py, the server's check)."""
    hf = tmp_path / "h.json"
    hf.write_text(json.dumps([{"ssh": "127.0.0.1", "ips": ["127.0.0.1"]}]))
    res = cli(["--hosts", "never-dialled-a,never-dialled-b", "--hostfile", str(hf), "-p", str(port_block(1)),
               "--output", "raw", PY, "-c", SHOW_RANK])
    assert res.returncode == 0, res.stderr
    assert res.stdout == "rank 0 None\n", res.stdout
    assert ("mlx-jupyter launch: --hostfile overrides --hosts, as with mlx.launch: --hosts "
            "never-dialled-a,never-dialled-b is not used") in res.stderr.splitlines(), res.stderr
