"""The magics' argument strings, fuzzed (issue 31 §4): accepted options round-trip to what the Cluster
gets, a refused one names its flag, and nothing else ever comes out (no traceback: one UsageError).

No kernel and no ranks: the Cluster is the stand-in of test_magics_args, and no line names a host
(a host name could be looked up on the network).
"""

from __future__ import annotations

import math
import shlex

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from mlx_jupyter import magics
from mlx_jupyter.vocab import limits
from mlx_jupyter.cluster import cluster as cluster_mod
from mlx_jupyter.magics import UsageError

from test_magics_args import FakeCluster

MAGICS = magics.MLXMagics(shell=None)
PARSED = {"mlx_cluster": MAGICS.mlx_cluster, "mlx_distributed": MAGICS.mlx_distributed,
          "mlx_debug": MAGICS.mlx_debug, "mlx_push": MAGICS.mlx_push, "mlx_pull": MAGICS.mlx_pull}
NUMERIC = {"-n": ("repeat_hosts", lambda v: limits.ranks_per_host("-n", v)),
           "--timeout": ("timeout", lambda v: limits.seconds("--timeout", v)),
           "--connect-timeout": ("connect_timeout",
                                 lambda v: limits.seconds("--connect-timeout", v, limits.MAX_SSH_SECONDS)),
           "--nodes": ("nodes", lambda v: limits.count("--nodes", v, limits.MAX_NODES))}
SAFE = ["start", "stop", "status", "where", "--clean", "--bind-to", "cores", "none", "--env", "A=1", "-h", "'",
        '"', "\\", "--", "=", "--timeout=", "-n=", "x y", "--slurm", "--keep-allocation", "help"]

_number_text = (st.integers(-10**6, 10**7).map(str) | st.floats(allow_nan=True, allow_infinity=True).map(repr)
                | st.sampled_from(["nan", "inf", "-inf", "1e400", "0", "-0", "1_0", "0x10", "", " ", "3.", ".5"])
                | st.text(st.characters(blacklist_categories=("Cc", "Cs", "Zl", "Zp")), max_size=6))
# (control characters left out: IPython's splitting keeps the quotes of '1\r', so shlex.quote is no oracle there;
# such a line is still one UsageError, which test_any_line_parses_or_is_one_usage_error covers)


def expected(flag: str, text: str):
    """The value ``flag`` takes from ``text``, or None when it is refused."""
    try:
        return NUMERIC[flag][1](text)
    except limits.OptionError:
        return None


@settings(max_examples=400, deadline=None)
@given(st.sampled_from(sorted(PARSED)), st.text(max_size=40) | st.lists(st.sampled_from(SAFE), max_size=6).map(" ".join))
def test_any_line_parses_or_is_one_usage_error(name, line):
    try:
        magics._parse(PARSED[name], line)
    except UsageError as exc:
        assert str(exc) and "Traceback" not in str(exc)


@settings(max_examples=400, deadline=None)
@given(st.lists(st.tuples(st.sampled_from(sorted(NUMERIC)), _number_text), min_size=1, max_size=4))
def test_numeric_options_round_trip_or_name_their_flag(options):
    line = "start " + " ".join(f"{flag} {shlex.quote(text)}" for flag, text in options)
    wanted = {flag: expected(flag, text) for flag, text in options}   # the last one of a flag wins...
    bad = [flag for flag, text in options if expected(flag, text) is None]   # ...but each is checked
    try:
        args = magics._parse(MAGICS.mlx_cluster, line)
    except UsageError as exc:
        assert bad or not all(text.strip() for _, text in options) or any(
            t.startswith("-") for _, t in options), (line, exc)   # a value like "-3x" reads as a flag
        named = [flag for flag in NUMERIC if f"argument {flag}" in str(exc) or f"/{flag.lstrip('-')}" in str(exc)
                 or ("argument -n/" in str(exc) and flag == "-n")]
        assert named or "expected one argument" in str(exc) or "unrecognized arguments" in str(exc), (line, exc)
        return
    assert not bad, (line, vars(args))
    for flag, value in wanted.items():
        got = getattr(args, NUMERIC[flag][0])
        assert got == value and (not isinstance(got, float) or math.isfinite(got))


@pytest.fixture
def start(monkeypatch):
    monkeypatch.setattr(cluster_mod, "Cluster", FakeCluster)
    monkeypatch.setattr(magics, "_cluster", None)
    FakeCluster.made.clear()
    return magics.MLXMagics(shell=None)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(n=st.integers(-3, 2000), timeout=st.floats(-1e9, 1e9) | st.sampled_from([math.nan, math.inf, 1e300]),
       connect=st.floats(-10, 1e5) | st.sampled_from([math.nan, math.inf, -math.inf]))
def test_accepted_start_options_reach_the_cluster(start, n, timeout, connect):
    line = f"start -n {n} --timeout {timeout!r} --connect-timeout {connect!r}"
    ok = 1 <= n <= limits.MAX_RANKS_PER_HOST and math.isfinite(timeout) and 0 < timeout <= limits.MAX_SECONDS \
        and math.isfinite(connect) and 0 < connect <= limits.MAX_SSH_SECONDS
    FakeCluster.made.clear()
    with pytest.raises(UsageError) as exc:
        start.mlx_cluster(line)
    if not ok:   # "-1e-05" reads as a flag to argparse: "expected one argument", naming the flag all the same
        msg = str(exc.value)
        assert msg.startswith(("argument -n/--repeat-hosts: ", "argument --timeout: ", "argument --connect-timeout: "))
        assert ("must be" in msg or "expected one argument" in msg) and FakeCluster.made == [], msg
        return
    assert "did not start: stand-in" in str(exc.value)
    kw = FakeCluster.made[-1]
    ssh = kw["ssh_options"]   # None when every ssh option is OpenSSH's default (connect timeout 10)
    assert (kw["n"], kw["timeout"], ssh.connect_timeout if ssh is not None else 10.0) == (n, timeout, connect)


@pytest.mark.parametrize("line, message", [
    ('start -n 2 "unclosed', "cannot split the options 'start -n 2 \"unclosed' into words (No closing quotation)"),
    ("start -n 100000", "argument -n/--repeat-hosts: '100000' must be a number of ranks per host from 1 to 1024"),
    ("start --timeout nan", "argument --timeout: 'nan' must be a number of seconds above 0"),
    ("start --connect-timeout -3", "argument --connect-timeout: '-3' must be a number of seconds above 0 and at "
                                   "most 3600 (e.g. --connect-timeout 10)"),
    ("start --connect-timeout nan", "argument --connect-timeout: 'nan'"),
])
def test_the_reported_lines_are_usage_errors(start, line, message):
    with pytest.raises(UsageError) as exc:
        start.mlx_cluster(line)
    assert message in str(exc.value) and FakeCluster.made == []


def test_the_cell_magic_checks_its_timeout_before_anything_runs():
    with pytest.raises(UsageError, match="argument --timeout: 'inf' must be a number of seconds"):
        MAGICS.mlx_distributed("--timeout inf", "x = 1")
    with pytest.raises(UsageError, match=r"argument rank: '-1' must be a rank from 0 to \d+ \(e.g. %mlx_debug 0\)"):
        MAGICS.mlx_debug("-1")
