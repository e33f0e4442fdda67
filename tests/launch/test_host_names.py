"""Hosts given by name: `--hosts localhost`, and ssh config aliases on the namespace hosts, get the
address ssh would reach them at, shown on stderr; MLX's ring then forms over those addresses."""

from __future__ import annotations

import pytest

from launch_helpers import cli

pytestmark = pytest.mark.timeout(120)

RING = ("import socket, mlx.core as mx; w = mx.distributed.init(backend='ring', strict=True); "
        "print(socket.gethostname(), 'sum', mx.distributed.all_sum(mx.ones(2) * (w.rank() + 1), group=w).tolist())")


def test_localhost_by_name_runs_mlx_ring(port_block) -> None:
    p = cli(["--hosts", "localhost", "-n", "2", "-p", str(port_block(2)), "--", "python", "-c", RING])
    assert p.returncode == 0, p.stderr
    assert "mlx-jupyter launch: addresses: localhost -> 127.0.0.1" in p.stderr.splitlines()
    assert p.stdout.count("sum [3.0, 3.0]") == 2, p.stdout


def test_cluster_on_localhost_by_name() -> None:
    """What the panel's hosts field and `%mlx_cluster start --hosts localhost` ask for."""
    from mlx_jupyter import Cluster

    with Cluster(n=2, hosts="localhost") as c:
        c.view.execute("import mlx.core as mx\nw = mx.distributed.init(backend='ring', strict=True)\n"
                       "s = mx.distributed.all_sum(mx.ones(1) * (w.rank() + 1), group=w).item()")
        assert c.view.pull("s") == [3.0, 3.0]


def test_ssh_config_aliases_resolve_to_their_hostname(testbed, tmp_path) -> None:
    cfg = testbed.write_ssh_config(tmp_path / "ssh_config", {"mac-a": 1, "mac-b": 2})
    p = cli(["--ssh-config", str(cfg), "--hosts", "mac-a,mac-b", "--", "python", "-c", RING])
    assert p.returncode == 0, p.stderr
    a, b = testbed.ips[:2]
    assert f"mlx-jupyter launch: addresses: mac-a (HostName {a}) -> {a}, mac-b (HostName {b}) -> {b}" \
        in p.stderr.splitlines(), p.stderr
    assert sorted(p.stdout.splitlines()) == ["[rank 0] h1 sum [3.0, 3.0]", "[rank 1] h2 sum [3.0, 3.0]"], p.stdout


def test_local_launches_default_to_a_free_port_block() -> None:
    """Two local launches at once do not collide on 32323; an explicit -p and remote hosts keep theirs."""
    import socket

    from mlx_jupyter.hostfile import parse_host_list
    from mlx_jupyter.launch.command import _starting_port, build_parser

    def port(*argv: str, hosts: str = "127.0.0.1,localhost") -> int:
        return _starting_port(build_parser().parse_args(list(argv)), parse_host_list(hosts, 2))

    taken = socket.socket()
    try:   # another job's ring on the default port (or the port is taken already: the same case)
        taken.bind(("127.0.0.1", 32323))
    except OSError:
        pass
    try:
        assert port() != 32323 and port("-p", "40000") == 40000 and port(hosts="10.9.9.9") == 32323
    finally:
        taken.close()
    p = cli(["-n", "2", "--", "python", "-c", RING.replace("socket.gethostname(), ", "")])
    assert p.returncode == 0 and p.stdout.count("sum [3.0, 3.0]") == 2, p.stderr
