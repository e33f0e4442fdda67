"""%mlx_cluster's flags reach the Cluster (no kernel, no ranks: the Cluster is a stand-in)."""

from __future__ import annotations

import pytest

from mlx_jupyter.cluster import cluster as cluster_mod
from mlx_jupyter import magics
from mlx_jupyter.magics import UsageError
from mlx_jupyter.net.ssh import SSHOptions


class FakeCluster:
    made: list[dict] = []

    def __init__(self, **kw):
        FakeCluster.made.append(kw)
        self.hosts = (kw.get("hosts") or "127.0.0.1").split(",")
        self.kw = kw

    def expected_size(self):
        return REAL_CLUSTER(**self.kw).expected_size()

    def start(self, progress=None):
        progress(0, self.expected_size())
        raise cluster_mod.ClusterError("stand-in: not started")


REAL_CLUSTER = cluster_mod.Cluster


@pytest.fixture
def start(monkeypatch):
    monkeypatch.setattr(cluster_mod, "Cluster", FakeCluster)
    monkeypatch.setattr(magics, "_cluster", None)
    FakeCluster.made.clear()
    m = magics.MLXMagics(shell=None)

    def run(line: str) -> dict:
        with pytest.raises(UsageError, match="did not start: stand-in"):
            m.mlx_cluster(line)
        return FakeCluster.made[-1]

    return run


def test_ssh_flags_become_ssh_options(start):
    kw = start("start --hosts a,b --ssh-config /etc/ssh/cfg --known-hosts /tmp/kh -i /k1 -i /k2 "
               "--accept-unknown-hosts --connect-timeout 3")
    opts = kw["ssh_options"]
    assert opts == SSHOptions(config=["/etc/ssh/cfg"], known_hosts="/tmp/kh", accept_unknown_hosts=True,
                              client_keys=["/k1", "/k2"], connect_timeout=3.0)
    assert kw["hosts"] == "a,b" and kw["n"] is None  # the one rule decides (hostfile.default_ranks_per_host)


def test_ranks_per_host_default_is_one_rule_for_every_way_in():
    """1 per host named (mlx.launch's -n), 2 when none is: Cluster, the magic (which passes no n),
    the panel's server and the launch CLI all ask hostfile.default_ranks_per_host."""
    from mlx_jupyter.launch.command import build_parser, make_config

    assert REAL_CLUSTER().n == 2 and REAL_CLUSTER(hosts="a,b").n == 1 and REAL_CLUSTER(hosts="a", n=3).n == 3
    parser = build_parser()
    assert len(make_config(parser.parse_args([]), ["true"]).hosts) == 2
    assert len(make_config(parser.parse_args(["--hosts", "10.0.0.1,10.0.0.2"]), ["true"]).hosts) == 2
    assert len(make_config(parser.parse_args(["-n", "3"]), ["true"]).hosts) == 3


def test_no_ssh_flags_keep_openssh_defaults(start):
    kw = start("start -n 2")
    assert kw["ssh_options"] is None and kw["n"] == 2


def test_bad_env_flag_is_named(monkeypatch, start):
    """A bare KEY passes this kernel's value on (as the launcher's --env KEY); an unset or invalid one is named."""
    m = magics.MLXMagics(shell=None)
    monkeypatch.delenv("OOPS_UNSET", raising=False)
    with pytest.raises(UsageError, match="--env OOPS_UNSET: is not set here"):
        m.mlx_cluster("start --env OOPS_UNSET")
    with pytest.raises(UsageError, match="--env 'a-b=1': expected KEY=VALUE"):
        m.mlx_cluster("start --env a-b=1")
    monkeypatch.setenv("OOPS_SET", "v")
    assert start("start --env OOPS_SET")["env"] == {"OOPS_SET": "v"}


def test_hosts_and_hostfile_together_are_an_error(start, tmp_path):
    m = magics.MLXMagics(shell=None)
    with pytest.raises(UsageError, match="--hosts and --hostfile: give hosts or a hostfile, not both"):
        m.mlx_cluster(f"start --hosts a,b --hostfile {tmp_path / 'h.json'}")
    assert FakeCluster.made == []


def test_progress_total_counts_the_hostfile(start, tmp_path, monkeypatch, capsys):
    hf = tmp_path / "hosts.json"
    hf.write_text('[{"ssh": "a", "ips": ["10.0.0.1"]}, {"ssh": "b", "ips": ["10.0.0.2"]}, '
                  '{"ssh": "c", "ips": ["10.0.0.3"]}]')
    shown = []
    monkeypatch.setattr(magics.RanksProgressBar, "__call__", lambda self, have, total: shown.append(total))
    monkeypatch.setattr(magics.RanksProgressBar, "__init__", lambda self, total, title: shown.append(total) or None)
    monkeypatch.setattr(magics.RanksProgressBar, "done", lambda self, text: None)
    monkeypatch.setattr(magics.RanksProgressBar, "failed", lambda self: None)
    start(f"start --hostfile {hf}")
    start(f"start -n 2 --hostfile {hf}")
    assert shown == [3, 3, 6, 6]


def test_unreadable_hostfile_is_named_before_starting(start, tmp_path):
    m = magics.MLXMagics(shell=None)
    with pytest.raises(UsageError, match="--hostfile .*missing.json"):
        m.mlx_cluster(f"start --hostfile {tmp_path / 'missing.json'}")


def test_slurm_flags_become_cluster_arguments(start):
    kw = start("start --slurm --nodes 3 -n 2 --partition gpu --time 30 --account lab "
               "--slurm-arg=--gres=gpu:1 --keep-allocation")
    assert kw["scheduler"] == "slurm" and kw["nodes"] == 3 and kw["n"] == 2
    assert (kw["partition"], kw["time"], kw["account"]) == ("gpu", "30", "lab")
    assert kw["slurm_args"] == ["--gres=gpu:1"] and kw["on_failure"] == "keep"
    assert REAL_CLUSTER(**kw).expected_size() == 6
    assert start("start --slurm")["on_failure"] == "release"


@pytest.mark.parametrize("line, message", [
    ("start --nodes 2", "--nodes only mean something with --slurm"),
    ("start --keep-allocation", "--keep-allocation only mean something with --slurm"),
    ("start --slurm --hosts a,b", "no --hosts or --hostfile"),
    ("start --slurm --nodes 0", "argument --nodes: '0' must be a whole number from 1 to 65536"),
])
def test_slurm_flags_misused_are_usage_errors(monkeypatch, line, message):
    monkeypatch.setattr(magics, "_cluster", None)
    with pytest.raises(UsageError, match=message):
        magics.MLXMagics(shell=None).mlx_cluster(line)


def test_cluster_slurm_arguments_are_checked():
    with pytest.raises(ValueError, match="only scheduler is 'slurm'"):
        REAL_CLUSTER(scheduler="pbs")
    with pytest.raises(ValueError, match="need scheduler='slurm'"):
        REAL_CLUSTER(nodes=2)
    with pytest.raises(ValueError, match="on_failure='never'"):
        REAL_CLUSTER(scheduler="slurm", on_failure="never")
    c = REAL_CLUSTER(scheduler="slurm", nodes=2, time="5")
    assert c.n == 1 and c.expected_size() == 2 and not c.local and c.allocation.opts.time == "5"
