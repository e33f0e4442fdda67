"""Each mpirun rank reports its own exit status (launch/mpi_exits.py), so the launcher names the first to
fail even when mpirun's message names none."""

from __future__ import annotations

import os
import signal
import subprocess
import sys

from hypothesis import given, settings
from hypothesis import strategies as st

from mlx_jupyter.launch.mpi import TaggedOutput
from mlx_jupyter.launch.mpi_exits import ExitMarkers, RankExit, reporting

MARK = "mlx-jupyter-exit-0123456789abcdef"

#: what mpirun 4.1.4 printed in the fresh-clone run that failed (ranks on 4 namespace hosts): the short
#: message alone, which names no rank
SHORT_ONLY = [
    "--------------------------------------------------------------------------",
    "Primary job  terminated normally, but 1 process returned",
    "a non-zero exit code. Per user-direction, the job has been aborted.",
    "--------------------------------------------------------------------------",
]


def _feed(lines, marker=MARK):
    out: list[tuple[int, str, str]] = []
    parts: dict[tuple[int, str], str] = {}

    def emit(rank: int, stream: str, text: str, ends: bool) -> None:   # a rank's pieces joined into its line
        parts[rank, stream] = parts.get((rank, stream), "") + text
        if ends:
            out.append((rank, stream, parts.pop((rank, stream))))

    tagged = TaggedOutput(emit, (4, 1), marker)
    for stream, line in lines:
        tagged.line(stream, line)
    tagged.flush()
    return out, tagged


def test_the_first_to_fail_is_named_when_mpirun_names_none():
    lines = [("stderr", "[1,0]<stderr>:err 0"), ("stderr", f"[1,0]<stderr>:{MARK} 0"),
             ("stderr", "[1,2]<stderr>:err 2"), ("stderr", f"[1,2]<stderr>:{MARK} 5"),
             ("stderr", f"[1,1]<stderr>:{MARK} 143"), ("stderr", f"[1,3]<stderr>:{MARK} 0"),
             *[("stderr", line) for line in SHORT_ONLY]]
    out, tagged = _feed(lines)
    assert tagged.failure is not None
    assert (tagged.failure.rank, tagged.failure.what) == (2, "exited with code 5")
    assert [(r, text) for r, _, text in out if r >= 0] == [(0, "err 0"), (2, "err 2")]   # the markers are hidden


def test_ranks_ended_by_the_abort_do_not_count_as_first_even_when_they_report_first():
    out, tagged = _feed([("stderr", f"[1,0]<stderr>:{MARK} 143"), ("stderr", f"[1,1]<stderr>:{MARK} 137"),
                         ("stderr", f"[1,3]<stderr>:{MARK} 1")])
    assert (tagged.failure.rank, tagged.failure.what) == (3, "exited with code 1")
    _, tagged = _feed([("stderr", f"[1,1]<stderr>:{MARK} 137"), ("stderr", f"[1,0]<stderr>:{MARK} 143")])
    assert (tagged.failure.rank, tagged.failure.what) == (1, "was killed by signal 9 (Killed)")


def test_no_failure_when_every_rank_reports_zero_and_mpirun_says_nothing():
    _, tagged = _feed([("stderr", f"[1,{r}]<stderr>:{MARK} 0") for r in range(3)])
    assert tagged.failure is None


def test_mpirun_message_is_the_fallback_when_no_rank_reported():
    _, tagged = _feed([("stderr", "  Process name: [[20464,1],2]"), ("stderr", "  Exit code:    5")])
    assert (tagged.failure.rank, tagged.failure.what) == (2, "exited with code 5")


def test_a_partial_line_before_the_marker_is_kept_and_another_marker_is_output():
    out, tagged = _feed([("stderr", f"[1,1]<stderr>:no newline{MARK} 3"),
                         ("stderr", "[1,0]<stderr>:mlx-jupyter-exit-ffffffffffffffff 9"),
                         ("stdout", f"[1,0]<stdout>:{MARK} 9")])
    assert out == [(1, "stderr", "no newline"), (0, "stderr", "mlx-jupyter-exit-ffffffffffffffff 9"),
                   (0, "stdout", f"{MARK} 9")]
    assert (tagged.failure.rank, tagged.failure.what) == (1, "exited with code 3")


@settings(max_examples=200, deadline=None)
@given(st.text(alphabet=st.characters(blacklist_characters="\n", blacklist_categories=("Cs",)), max_size=40),
       st.integers(0, 255), st.integers(0, 1023))
def test_a_marker_at_the_end_of_any_line_is_taken_and_the_rest_kept(text, status, rank):
    markers = ExitMarkers(MARK)
    rest = markers.take(rank, f"{text}{MARK} {status}")
    assert rest == (text or None)
    assert markers.exits == [RankExit(rank, status)]
    assert markers.take(rank, text) == text and len(markers.exits) == 1


# ------------------------------------------------------- the real shell --

def _run(argv, **kw):
    return subprocess.run(reporting(argv, MARK), capture_output=True, text=True, timeout=30, **kw)


def test_the_shell_reports_the_status_and_passes_arguments_verbatim():
    res = _run([sys.executable, "-c", "import sys; print(sys.argv[1:]); sys.exit(4)", "a b", "q'u\"o $HOME", ""])
    assert res.returncode == 4
    assert res.stdout == "['a b', 'q\\'u\"o $HOME', '']\n"
    assert res.stderr == f"{MARK} 4\n"


def test_a_missing_command_is_said_and_reported_127():
    res = _run(["no-such-command-mlxj"])
    assert res.returncode == 127
    assert "no-such-command-mlxj: not found" in res.stderr and res.stderr.endswith(f"{MARK} 127\n")


def _ready_child(code: str) -> subprocess.Popen:
    proc = subprocess.Popen(reporting([sys.executable, "-c", code], MARK), stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, start_new_session=True)
    assert proc.stdout is not None and proc.stdout.readline() == "ready\n"
    return proc


def _wait(setup: str = "") -> str:
    return f"import signal, sys, time\n{setup}print('ready', flush=True)\n"


def test_signals_to_the_group_reach_the_rank_and_the_shell_dies_as_it_did():
    """Ctrl-C (mpirun signals the rank's process group) raises KeyboardInterrupt in the rank; a rank killed
    by a signal makes mpirun see that signal; the shell's own 'Terminated' note never shows."""
    proc = _ready_child("import sys, time\ntry:\n    print('ready', flush=True)\n    time.sleep(30)\n"
                         "except KeyboardInterrupt:\n    print('KI', flush=True); sys.exit(7)")
    os.killpg(proc.pid, signal.SIGINT)
    out, err = proc.communicate(timeout=20)
    assert (proc.returncode, out, err) == (7, "KI\n", f"{MARK} 7\n")
    proc = _ready_child(_wait("signal.signal(signal.SIGUSR1, lambda *a: print('usr1', flush=True))\n")
                        + "time.sleep(30)")
    os.killpg(proc.pid, signal.SIGUSR1)   # --where-on-signal: the shell survives it
    assert proc.stdout.readline() == "usr1\n"
    os.killpg(proc.pid, signal.SIGTERM)
    out, err = proc.communicate(timeout=20)
    assert proc.returncode == -signal.SIGTERM
    assert err == f"{MARK} 143\n"   # no "Terminated" from the shell
