"""The launcher's terminal keeps a labelled line whole when it comes in chunks (mpirun forwards its ranks'
output so), and still shows an unfinished line at most ``STALL`` s behind (a prompt, a streamed reply)."""

from __future__ import annotations

import asyncio

from mlx_jupyter.launch.rank_output import STALL, LineHold


def test_a_line_in_chunks_with_another_ranks_line_between_is_emitted_whole():
    emitted: list[tuple[int, str, str, bool]] = []

    async def go() -> None:
        hold = LineHold(lambda *piece: emitted.append(piece))
        hold(0, "stdout", "host 0 2 ", False)
        hold(1, "stdout", "host 1 2 2.0", True)
        hold(0, "stdout", "2.0", True)

    asyncio.run(go())
    assert emitted == [(1, "stdout", "host 1 2 2.0", True), (0, "stdout", "host 0 2 2.0", True)]


def test_an_unfinished_line_goes_on_after_the_stall_and_its_rest_continues_it():
    emitted: list[tuple[int, str, str, bool]] = []

    async def go() -> float:
        shown = asyncio.Event()
        hold = LineHold(lambda *piece: (emitted.append(piece), shown.set()))
        loop = asyncio.get_running_loop()
        began = loop.time()
        hold(0, "stdout", "prompt> ", False)
        await asyncio.wait_for(shown.wait(), 5)
        took = loop.time() - began
        hold(0, "stdout", "yes", True)
        hold(1, "stderr", "left", False)
        hold.flush()   # the launch ends: what is held goes out now
        return took

    took = asyncio.run(go())
    assert STALL <= took < STALL + 2, took
    assert emitted == [(0, "stdout", "prompt> ", False), (0, "stdout", "yes", True), (1, "stderr", "left", False)]


def test_off_a_running_loop_pieces_go_on_as_they_come():
    emitted: list[tuple[int, str, str, bool]] = []
    LineHold(lambda *piece: emitted.append(piece))(0, "stdout", "part", False)
    assert emitted == [(0, "stdout", "part", False)]
