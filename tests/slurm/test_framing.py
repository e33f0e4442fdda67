"""The rank-side framer under Slurm (issue 43 §1): a rank's output comes back in pieces as it is written,
one line of srun's a piece, and the launcher joins them into the rank's own lines."""

from __future__ import annotations

import os
import signal
import subprocess
import sys

import psutil
from hypothesis import given
from hypothesis import strategies as st

from mlx_jupyter.launch.slurm.framer import FRAME, PIECE, Stream
from mlx_jupyter.launch.slurm.output import StepOutput, unframe
from mlx_jupyter.launch.slurm.wrapper import MARKER, framer_source


def relay(chunks: list[bytes]) -> list[bytes]:
    """What the framer writes for the command's ``chunks`` (reads of one pipe, in order)."""
    out: list[bytes] = []
    stream = Stream(out.append)
    for chunk in chunks:
        stream.take(chunk)
    stream.end()
    return out


def read_back(framed: list[bytes], rank: int = 0) -> list[tuple[str, bool]]:
    """The pieces the launcher gives out for those lines, as srun passes them on with ``--label``."""
    got: list[tuple[str, bool]] = []
    out = StepOutput(2, lambda r, s, t, e: got.append((t, e)), lambda *a: None, lambda *a: None)
    for line in framed:
        assert line.endswith(b"\n") and b"\n" not in line[:-1]
        out.line("stdout", f"{rank}: {line[:-1].decode('utf-8')}")   # strict: no character was cut
    return got


def joined(pieces: list[tuple[str, bool]]) -> str:
    return "".join(text + ("\n" if ends else "") for text, ends in pieces)


texts = st.text(st.characters(blacklist_categories=("Cs",), blacklist_characters="\r"), max_size=1500)


@given(texts, st.lists(st.integers(0, 1600), max_size=8))
def test_any_output_cut_anywhere_comes_back_whole_in_lines_of_at_most_a_slurm_message(text, cuts):
    """Reads cut anywhere (inside a character too): the launcher gets the rank's text back exactly, each framed
    line is one line of at most 1024 bytes (slurmstepd's message) and holds whole characters."""
    data = text.encode()
    at = sorted({min(c, len(data)) for c in cuts})
    chunks = [data[a:b] for a, b in zip([0, *at], [*at, len(data)])]
    framed = relay(chunks)
    assert all(len(line) <= 1024 and line.startswith(FRAME) for line in framed)
    assert joined(read_back(framed)) == text


def test_a_token_without_a_newline_is_its_own_piece_and_the_newline_ends_the_line():
    assert read_back(relay([b"Hello", b" world", b"!\nnext"])) == [
        ("Hello", False), (" world", False), ("!", True), ("next", False)]
    assert read_back(relay([b"a\\n\r\n"])) == [("a\\n", True)]      # a backslash is the rank's own; \r\n ends a line
    assert read_back(relay([b"\r 50%", b"\r100%\n"])) == [("\r 50%", False), ("\r100%", True)]   # progress
    big = "é" * PIECE   # 2 bytes each: cut into lines of whole characters
    assert joined(read_back(relay([big.encode()]))) == big
    assert unframe(FRAME.decode() + "x\\qy") == [("x\\qy", False)]   # an unknown escape is left as it is


def test_the_wrapper_s_reports_are_never_taken_from_the_rank_s_own_output():
    """A rank printing the wrapper's marker is output, framed: it cannot fake its start or exit."""
    starts, exits, got = [], [], []
    out = StepOutput(2, lambda r, s, t, e: got.append((r, t)), lambda *a: starts.append(a), lambda *a: exits.append(a))
    for line in relay([f"{MARKER}-exit 0\n".encode()]):
        out.line("stderr", f"1: {line[:-1].decode()}")
    assert got == [(1, f"{MARKER}-exit 0")] and not exits and not starts


def framed_run(code: str, **kw) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-c", framer_source(), sys.executable, "-c", code],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, **kw)


def test_the_framer_relays_both_streams_and_stdin_and_exits_with_the_command_s_code():
    proc = framed_run("import sys; print(sys.stdin.read().upper(), end='', flush=True); "
                      "sys.stderr.write('oops\\n'); sys.exit(3)", stdin=subprocess.PIPE)
    out, err = proc.communicate(b"typed", timeout=30)
    assert proc.returncode == 3
    assert out == FRAME + b"TYPED\n" and err == FRAME + b"oops\\n\n"


def test_a_command_killed_by_a_signal_gives_128_plus_it_and_one_that_cannot_start_127():
    proc = framed_run("import os, signal; os.kill(os.getpid(), signal.SIGTERM)")
    proc.communicate(timeout=30)
    assert proc.returncode == 128 + signal.SIGTERM
    missing = subprocess.run([sys.executable, "-c", framer_source(), "/nonexistent/cmd"], capture_output=True, timeout=30)
    assert missing.returncode == 127 and b"cannot run '/nonexistent/cmd'" in missing.stderr


def test_the_framer_outlives_the_signals_the_wrapper_ignores_and_the_command_gets_them():
    """SIGINT to the framer alone: it stays and relays; SIGINT to the command: its KeyboardInterrupt, relayed."""
    proc = framed_run("import sys, time\nprint('up', flush=True)\n"
                      "try:\n    sys.stdin.read()\nexcept KeyboardInterrupt:\n    print('interrupted', flush=True)\n",
                      stdin=subprocess.PIPE)
    assert proc.stdout.readline() == FRAME + b"up\\n\n"
    child = psutil.Process(proc.pid).children()[0].pid
    os.kill(proc.pid, signal.SIGINT)
    os.kill(child, signal.SIGINT)
    assert proc.stdout.readline() == FRAME + b"interrupted\\n\n"
    proc.stdin.close()
    assert proc.wait(30) == 0



def test_the_command_keeps_the_descriptors_the_wrapper_opened_for_it(tmp_path):
    """The wrapper hands files over as /proc/self/fd/N (the ring hostfile): the framer must not close them."""
    hostfile = tmp_path / "hosts.json"
    hostfile.write_text('["a:1"]')
    fd = os.open(hostfile, os.O_RDONLY)
    try:
        proc = framed_run(f"print(open('/proc/self/fd/{fd}').read())", pass_fds=(fd,))
        out, err = proc.communicate(timeout=30)
    finally:
        os.close(fd)
    assert proc.returncode == 0, err
    assert out == FRAME + b'["a:1"]\\n\n'


def _feed(out: StepOutput, rank: int, stream: str, data: bytes) -> None:
    for line in relay([data]):
        out.line(stream, f"{rank}: {line[:-1].decode()}")


def test_a_rank_s_unfinished_lines_end_at_its_exit_and_the_others_at_the_step_s_end():
    got, exits = [], []
    out = StepOutput(3, lambda r, s, t, e: got.append((r, s, t, e)), lambda *a: None, lambda r, c: exits.append((r, c)))
    for rank, stream, data in [(0, "stdout", b"tok"), (0, "stderr", b"err"), (1, "stdout", b"one"),
                               (1, "stderr", b"whole\n"), (2, "stdout", b"a\nb")]:
        _feed(out, rank, stream, data)
    _feed(out, 2, "stdout", b"c\n")   # ends rank 2's line: nothing of it is left open
    assert got[:4] == [(0, "stdout", "tok", False), (0, "stderr", "err", False), (1, "stdout", "one", False),
                       (1, "stderr", "whole", True)]
    got.clear()
    out.line("stderr", f"0: {MARKER}-exit 300")
    assert got == [(0, "stderr", "", True), (0, "stdout", "", True)] and exits == [(0, 255)]
    got.clear()
    out.end_lines()
    assert got == [(1, "stdout", "", True)]
    out.end_lines()
    assert got == [(1, "stdout", "", True)]   # each line is ended once


def test_srun_s_own_lines_are_rank_minus_one_whole_lines_and_the_last_six_are_kept():
    got = []
    out = StepOutput(2, lambda r, s, t, e: got.append((r, s, t, e)), lambda *a: None, lambda *a: None)
    out.line("stdout", "2: a label equal to the step's size")
    for i in range(8):
        out.line("stderr", f"srun: note {i}")
    assert got[0] == (-1, "stdout", "2: a label equal to the step's size", True)
    assert got[1:] == [(-1, "stderr", f"srun: note {i}", True) for i in range(8)]
    assert list(out.own) == [f"srun: note {i}" for i in range(2, 8)]


def test_the_last_marker_of_a_line_is_the_report_and_the_text_before_it_is_output():
    got, exits = [], []
    out = StepOutput(2, lambda r, s, t, e: got.append((r, t, e)), lambda *a: None, lambda r, c: exits.append((r, c)))
    out.line("stderr", f"1: x{MARKER}-exit 0")
    out.line("stderr", f"1: {MARKER}-exit x{MARKER}-exit 4")
    assert got == [(1, "x", True), (1, f"{MARKER}-exit x", True)] and exits == [(1, 0), (1, 4)]
