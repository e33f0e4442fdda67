"""The speed guard's verdict (benchmarks/guard_verdict.py): ratios of medians against limits. No timing."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
from guard_verdict import LIMITS, Row, failed, table  # noqa: E402


def test_the_ratio_is_median_over_median_of_the_alternated_samples():
    row = Row("cell", "trivial cell", "%%px", ours=[0.004, 0.1, 0.005], theirs=[0.010, 0.011, 0.5])
    assert row.ratio == pytest.approx(0.005 / 0.011)   # one slow sample on either side does not move it
    assert row.limit == LIMITS["cell"] == 1.0 and row.verdict == "ok"


def test_at_the_limit_passes_above_it_fails():
    at = Row("core_4k", "4 KiB", "Open MPI", ours=[LIMITS["core_4k"]], theirs=[1.0])
    above = Row("core_4k", "4 KiB", "Open MPI", ours=[LIMITS["core_4k"] * 1.01], theirs=[1.0])
    assert at.verdict == "ok" and above.verdict == "FAIL"
    assert failed([at, above]) == [above]


@pytest.mark.parametrize("key", sorted(LIMITS))
def test_twice_as_slow_fails_where_the_quiet_ratio_was_half_the_limit_or_more(key):
    """A limit is no wider than twice a passing ratio of half its size: our side doubling from there fails."""
    limit = LIMITS[key]
    passing = Row(key, key, "ref", ours=[limit * 0.55], theirs=[1.0])
    doubled = Row(key, key, "ref", ours=[limit * 0.55 * 2], theirs=[1.0])
    assert passing.verdict == "ok" and doubled.verdict == "FAIL"


def test_a_reference_that_did_not_run_fails_unless_allowed():
    missing = Row("core_64m", "64 MiB", "Open MPI", ours=[0.1], missing="needs mpi4py")
    assert missing.ratio is None and missing.verdict == "NOT RUN"
    assert failed([missing]) == [missing] and failed([missing], allow_missing=True) == []


def test_a_row_without_a_limit_is_shown_not_checked():
    info = Row("versus base", "trivial cell", "base", ours=[2.0], theirs=[1.0])
    assert info.limit is None and info.verdict == "info" and failed([info]) == []


def test_the_table_shows_both_medians_the_ratio_the_limit_and_the_verdict():
    rows = [Row("cell", "trivial cell", "ipyparallel %%px", ours=[0.005], theirs=[0.016]),
            Row("core_4k", "core all_sum 4 KiB", "Open MPI", ours=[2.6e-6], theirs=[1.3e-6]),
            Row("core_64m", "core all_sum 64 MiB", "Open MPI", missing="needs mpi4py")]
    lines = table(rows).splitlines()
    assert lines[0].split() == ["check", "ours", "reference", "ratio", "limit", "verdict"]
    assert "5.00 ms" in lines[2] and "16.00 ms" in lines[2] and "0.312" in lines[2] and lines[2].endswith("ok")
    assert "2.60 us" in lines[3] and "2.000" in lines[3] and lines[3].endswith("FAIL")
    assert lines[4].endswith("NOT RUN (needs mpi4py)")
