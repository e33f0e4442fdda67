"""Numeric options checked one way (vocab/limits.py) by the CLIs, the magics and the panel's server (issue 31 §4)."""

from __future__ import annotations

import argparse
import io
import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from mlx_jupyter.vocab import limits
from mlx_jupyter.configurator import command as config_cli
from mlx_jupyter.launch import command as launch_cli
from mlx_jupyter.server.requests import MAX_RANKS, RequestError, parse_start


@settings(max_examples=300, deadline=None)
@given(st.floats(allow_nan=True, allow_infinity=True) | st.integers(-10**6, 10**7) | st.text(max_size=12))
def test_seconds_are_finite_above_zero_and_bounded_or_named(value):
    try:
        got = limits.seconds("--timeout", value)
    except limits.OptionError as exc:
        assert exc.flag == "--timeout" and str(exc).startswith("--timeout ") and "e.g. --timeout 30" in str(exc)
        return
    assert math.isfinite(got) and 0 < got <= limits.MAX_SECONDS and got == float(value)


@settings(max_examples=300, deadline=None)
@given(st.integers(-10**6, 10**6) | st.text(max_size=8) | st.floats() | st.sampled_from(["²", "١٢", "1_0", " 3 "]))
def test_ranks_per_host_round_trip_or_are_named(value):
    try:
        got = limits.ranks_per_host("-n", value if not isinstance(value, int) else str(value))
    except limits.OptionError as exc:
        assert str(exc).startswith("-n ") and "from 1 to 1024" in str(exc)
        return
    assert 1 <= got <= limits.MAX_RANKS_PER_HOST and got == int(value)


@pytest.mark.parametrize("argv, flag", [
    (["-n", "100000", "--", "true"], "-n/--repeat-hosts: '100000' must be a number of ranks per host from 1 to 1024"),
    (["-n", "0", "--", "true"], "-n/--repeat-hosts: '0'"),
    (["--connect-timeout", "-3", "--", "true"], "--connect-timeout: '-3' must be a number of seconds above 0"),
    (["--connect-timeout", "nan", "--", "true"], "--connect-timeout: 'nan'"),
    (["--keepalive-interval", "inf", "--", "true"], "--keepalive-interval: 'inf'"),
    (["-p", "70000", "--", "true"], "-p/--starting-port: '70000' must be a port from 1 to 65535"),
    (["--connections-per-ip", "1e3", "--", "true"], "--connections-per-ip: '1e3'"),
    (["--stdin-rank", "-1", "--", "true"], "--stdin-rank: '-1' must be a rank"),
    (["--slurm", "--nodes", "0", "--", "true"], "--nodes: '0'"),
])
def test_launch_refuses_bad_numbers_naming_the_flag(argv, flag, capsys):
    with pytest.raises(SystemExit) as exc:
        launch_cli.main(argv)
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert f"argument {flag}" in err and "Traceback" not in err, err


@pytest.mark.parametrize("value", ["-3", "nan", "0", "inf", "1e9", "ten"])
def test_config_refuses_a_bad_connect_timeout_before_any_ssh(value, capsys):
    """Was an asyncssh traceback (-3) or a wait of "nan s"."""
    assert config_cli.main(["--hosts", "127.0.0.1", "--connect-timeout", value], out=io.StringIO()) == 2
    err = capsys.readouterr().err
    assert f"argument --connect-timeout: '{value}' must be a number of seconds above 0 and at most 3600" in err, err
    assert "(e.g. --connect-timeout 10)" in err


def test_good_numbers_reach_the_options():
    args = launch_cli.build_parser().parse_args(["-n", "3", "--connect-timeout", "2.5", "-p", "40000",
                                                 "--keepalive-interval", "0.5", "--stdin-rank", "0"])
    assert (args.repeat_hosts, args.connect_timeout, args.starting_port, args.keepalive_interval,
            args.stdin_rank) == (3, 2.5, 40000, 0.5, 0)


@pytest.mark.parametrize("n", [0, 65, 10**9, -1])
def test_the_server_checks_n_with_the_same_rule(n):
    with pytest.raises(RequestError) as exc:
        parse_start(f'{{"n": {n}}}'.encode())
    assert exc.value.field == "n" and f"from 1 to {MAX_RANKS}" in str(exc.value)
    assert parse_start(b'{"n": 64, "hosts": "127.0.0.1"}').n == 64


def test_arg_type_is_argparse_friendly():
    p = argparse.ArgumentParser(exit_on_error=False)
    p.add_argument("--timeout", type=limits.arg_type(limits.seconds, "--timeout"))
    assert p.parse_args(["--timeout", "1.5"]).timeout == 1.5
    with pytest.raises(argparse.ArgumentError, match="'nan' must be a number of seconds"):
        p.parse_args(["--timeout", "nan"])


@pytest.mark.parametrize("bad", [float("nan"), float("inf"), 0, -3, "soon"])
def test_cluster_refuses_a_timeout_the_magics_refuse(bad):
    """Plain Python's Cluster(timeout=...) is checked by the same rule as --timeout (before anything starts)."""
    from mlx_jupyter.cluster import Cluster

    with pytest.raises(limits.OptionError, match=r"timeout=.*must be a number of seconds above 0"):
        Cluster(n=1, timeout=bad)
