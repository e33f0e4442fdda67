"""Streamed output (issue 43 §1): a line written in pieces comes out on one terminal line, as it comes.

The ranks are real processes under `mlx-jupyter launch`; each piece is written when the test sends a
stdin line naming its rank, and the test sends the next only once it saw the last on the launcher's
pipe: so the order is the test's, and a piece shown before its newline is seen as such.
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import subprocess
import threading

import pytest

from launch_helpers import PY, ROOT, cli_env

#: each stdin line is [rank, stream, text]: that rank writes text to that stream, flushed, no newline added
RANK = (
    "import json, os, sys\n"
    "me = int(os.environ.get('MLX_RANK') or os.environ['OMPI_COMM_WORLD_RANK'])\n"
    "for line in sys.stdin:\n"
    "    rank, stream, text = json.loads(line)\n"
    "    if rank == me:\n"
    "        out = sys.stdout if stream == 'stdout' else sys.stderr\n"
    "        out.write(text); out.flush()\n"
)


class Streamed:
    """A running launcher of ``ranks`` RANK processes; its stdout (and stderr with ``merged``) read as bytes come."""

    def __init__(self, ranks: int | None = 2, merged: bool = False, output: tuple[str, ...] = (),
                 env: dict | None = None):
        count = ["-n", str(ranks)] if ranks is not None else []
        self.proc = subprocess.Popen([PY, "-m", "mlx_jupyter", "launch", *count, *output, "--", PY, "-c", RANK],
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                     stderr=subprocess.STDOUT if merged else subprocess.DEVNULL,
                                     env=cli_env(env), cwd=ROOT)
        self.text = ""
        self._cond = threading.Condition()
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        fd = self.proc.stdout.fileno()
        while data := os.read(fd, 4096):
            with self._cond:
                self.text += data.decode()
                self._cond.notify_all()

    def write(self, rank: int, text: str, stream: str = "stdout") -> None:
        self.proc.stdin.write((json.dumps([rank, stream, text]) + "\n").encode())
        self.proc.stdin.flush()

    def shows(self, expected: str, timeout: float = 60) -> str:
        """Wait until the output so far is exactly ``expected``; the output. (``timeout`` only ends a hang: the
        first step waits for the launch to start, over ssh on a loaded machine too.)"""
        with self._cond:
            if not self._cond.wait_for(lambda: self.text == expected, timeout):
                raise AssertionError(f"after {timeout} s the launcher showed {self.text!r}, not {expected!r}")
            return self.text

    def step(self, rank: int, text: str, expected: str, stream: str = "stdout") -> None:
        """Have ``rank`` write ``text``; wait until the launcher shows ``expected`` in all."""
        self.write(rank, text, stream)
        self.shows(expected)

    def finish(self, timeout: float = 30) -> int:
        self.proc.stdin.close()
        try:
            return self.proc.wait(timeout)
        finally:
            self._reader.join(5)

    def __enter__(self) -> "Streamed":
        return self

    def __exit__(self, *exc) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(10)


def test_tokens_of_a_rank_continue_its_line_with_one_prefix():
    with Streamed() as s:
        s.step(0, "streamed", "[rank 0] streamed")          # shown before its newline
        s.step(0, " tokens", "[rank 0] streamed tokens")    # on the same line, no second prefix
        s.step(0, " here\n", "[rank 0] streamed tokens here\n")
        s.step(1, "and", "[rank 0] streamed tokens here\n[rank 1] and")
        s.step(1, " mine\n", "[rank 0] streamed tokens here\n[rank 1] and mine\n")
        assert s.finish() == 0
        assert s.text == "[rank 0] streamed tokens here\n[rank 1] and mine\n"


def test_another_ranks_output_breaks_the_line_and_the_rest_is_prefixed_again():
    with Streamed() as s:
        s.step(0, "a", "[rank 0] a")
        s.step(1, "x", "[rank 0] a\n[rank 1] x")
        s.step(0, " b", "[rank 0] a\n[rank 1] x\n[rank 0]  b")
        s.step(0, "\n", "[rank 0] a\n[rank 1] x\n[rank 0]  b\n")
        s.write(1, "\n")   # rank 1's line was ended for rank 0's: its newline adds no empty line
        s.step(1, "y\n", "[rank 0] a\n[rank 1] x\n[rank 0]  b\n[rank 1] y\n")
        assert s.finish() == 0


def test_the_other_stream_breaks_the_line_when_both_go_to_one_place():
    with Streamed(merged=True) as s:
        s.step(0, "loading", "[rank 0] loading")
        s.step(0, "warning\n", "[rank 0] loading\n[rank 0] warning\n", stream="stderr")
        s.step(0, " done\n", "[rank 0] loading\n[rank 0] warning\n[rank 0]  done\n")
        assert s.finish() == 0


def test_carriage_return_progress_keeps_its_prefix_in_place():
    with Streamed() as s:
        s.step(0, "\r 10%", "\r[rank 0]  10%")
        s.step(0, "\r 50%", "\r[rank 0]  10%\r[rank 0]  50%")
        s.step(0, "\r100%\n", "\r[rank 0]  10%\r[rank 0]  50%\r[rank 0] 100%\n")
        assert s.finish() == 0


def test_raw_output_of_several_ranks_keeps_each_line_whole():
    """Unlabelled, a piece cannot say whose it is: each rank's line is written once it ends, so no two ranks'
    pieces mix within a line (a hostfile test sorting the ranks' raw lines saw them mixed)."""
    with Streamed(output=("--output", "raw")) as s:
        s.write(0, "a")
        s.write(1, "x")
        s.step(0, "b\n", "ab\n")   # never "ax...": rank 1's piece waits for its own line's end
        s.step(1, "y\n", "ab\nxy\n")
        s.write(0, "last, unfinished")
        assert s.finish() == 0
        assert s.text == "ab\nxy\nlast, unfinished\n"


def test_an_unfinished_last_line_is_ended_before_the_launcher_exits():
    with Streamed() as s:
        s.step(0, "no newline", "[rank 0] no newline")
        assert s.finish() == 0
        assert s.text == "[rank 0] no newline\n"


def test_ranks_on_other_hosts_stream_over_ssh(testbed):
    with Streamed(None, output=(*testbed.cli_ssh_args(), "--hosts", ",".join(testbed.ips[:2]))) as s:
        s.step(1, "streamed", "[rank 1] streamed")
        s.step(1, " tokens\n", "[rank 1] streamed tokens\n")
        assert s.finish() == 0


@pytest.mark.skipif(shutil.which("mpirun") is None, reason="mpirun not installed (apt-get install openmpi-bin)")
def test_mpi_ranks_stream_through_mpiruns_tags():
    # mpirun gives this machine's ranks' stdin to rank 0 only: rank 1 reads EOF and ends
    root = {"OMPI_ALLOW_RUN_AS_ROOT": "1", "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM": "1"}   # the tests run as root
    with Streamed(output=("--backend", "mpi"), env=root) as s:
        s.step(0, "streamed", "[rank 0] streamed")
        s.step(0, " tokens", "[rank 0] streamed tokens")
        s.step(0, "\n", "[rank 0] streamed tokens\n")
        assert s.finish() == 0


# ---------------------------------------------------------------- the pieces, without processes


def test_mpi_tags_in_pieces_give_each_rank_its_pieces():
    from mlx_jupyter.launch.mpi import TaggedOutput

    got: list = []
    t = TaggedOutput(lambda *a: got.append(a), (4, 1))
    # as Open MPI 4.1.4 wrote two ranks' `print(w, end="", flush=True)`: each chunk tagged, one mpirun line
    t.piece("stdout", "[1,1]<stdout>:tok", False)
    t.piece("stdout", "[1,0]<stdout>:tok[1,1]<std", False)   # a tag cut at the end of a piece is held
    t.piece("stdout", "out>: more", False)
    t.piece("stdout", " still", False)                        # no tag: the chunk mpirun's line is in goes on
    t.piece("stdout", "[1,0]<stdout>: end", True)
    t.piece("stderr", "mpirun: a note", False)                # mpirun's own line is read whole
    t.piece("stderr", " of its own", True)
    t.flush()
    assert got == [(1, "stdout", "tok", False), (0, "stdout", "tok", False), (1, "stdout", " more", False),
                   (1, "stdout", " still", False), (0, "stdout", " end", True), (-1, "stderr", "mpirun: a note of its own", True),
                   (1, "stdout", "", True)]



def _split(chunks: list[bytes], linger: float = 0.05) -> list[tuple[str, bool]]:
    """What a LineSplitter emits for ``chunks`` fed one by one, each after the previous one's piece (if any) came."""
    from mlx_jupyter.launch.streams import LineSplitter

    async def run() -> list[tuple[str, bool]]:
        got: list[tuple[str, bool]] = []
        piece = asyncio.Event()

        def emit(text: str, ends: bool) -> None:
            got.append((text, ends))
            if not ends:
                piece.set()

        splitter = LineSplitter(emit, linger)
        for chunk in chunks:
            piece.clear()
            splitter.feed(chunk)
            if not chunk.endswith(b"\n"):
                await asyncio.wait_for(piece.wait(), 5)
        splitter.close()
        return got

    return asyncio.run(run())


def test_splitter_emits_an_unfinished_line_in_pieces_then_its_end():
    assert _split([b"tok", b" en", b"\n"]) == [("tok", False), (" en", False), ("", True)]
    assert _split([b"a\nb", b"c\n"]) == [("a", True), ("b", False), ("c", True)]
    assert _split([b"last"]) == [("last", False), ("", True)]   # the end of the stream ends the line
    assert _split([b"x\r", b"\n"]) == [("x", False), ("", True)]   # a "\r" is held: it may begin a "\r\n"


def test_on_text_gets_pieces_and_on_output_keeps_one_call_each(monkeypatch):
    from mlx_jupyter.launch.launch_config import LaunchConfig
    from mlx_jupyter.launch.rank_output import RankOutput

    texts, lines = [], []
    config = LaunchConfig(command=["x"], on_text=lambda *a: texts.append(a), on_output=lambda *a: lines.append(a))
    out = RankOutput(config, lambda: 2)
    out(0, "stdout", "tok", False)
    out(0, "stdout", "en", True)
    assert texts == [(0, "stdout", "tok", False), (0, "stdout", "en", True)]
    assert lines == [(0, "stdout", "tok"), (0, "stdout", "en")]


@pytest.mark.parametrize("same", [True, False])
def test_terminal_breaks_only_where_other_output_comes_between(monkeypatch, capsys, same):
    from mlx_jupyter.launch import terminal

    monkeypatch.setattr(terminal, "_same_file", lambda a, b: same)
    t = terminal.Terminal()
    t.write(0, "stdout", "a", False, "[0] ")
    t.write(0, "stderr", "w", True, "[0] ")
    t.write(0, "stdout", "b", True, "[0] ")
    out, err = capsys.readouterr()
    assert (out, err) == (("[0] a\n[0] b\n", "[0] w\n") if same else ("[0] ab\n", "[0] w\n"))


def test_a_ranks_exit_report_ends_its_unfinished_stderr_line_unseen():
    from mlx_jupyter.launch.mpi import TaggedOutput

    got: list = []
    t = TaggedOutput(lambda *a: got.append(a), (4, 1), "mark")
    t.piece("stderr", "[1,0]<stderr>:oops", False)
    t.piece("stderr", "[1,0]<stderr>:mark 3", True)   # the reporting shell's line after the rank's last piece
    t.flush()
    assert got == [(0, "stderr", "oops", False), (0, "stderr", "", True)]
    assert (t.failure.rank, t.failure.what) == (0, "exited with code 3")


def test_a_fault_in_showing_a_chunk_is_said_once_and_the_rest_still_comes(capsys):
    """A bug of ours in the output path (a parser raising) must not swallow the rank's output in silence."""
    from mlx_jupyter.launch.streams import LineSplitter, pump

    class Chunks:
        def __init__(self, chunks):
            self.chunks = list(chunks)

        async def read(self, n):
            return self.chunks.pop(0) if self.chunks else b""

    got = []

    def emit(text, ends):
        if text.startswith("bad"):
            raise ValueError("a parser's bug")
        got.append((text, ends))

    asyncio.run(pump(Chunks([b"one\n", b"bad\n", b"bad again\n", b"two\n"]), LineSplitter(emit, None)))
    assert got == [("one", True), ("two", True)]
    err = capsys.readouterr().err
    assert err.count("internal error showing a rank's output") == 1 and "a parser's bug" in err
