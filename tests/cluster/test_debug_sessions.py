"""The notebook's side of the ranks' pdb sessions, alone: who prompts when, and the no-stdin path."""

from __future__ import annotations

from typing import Optional

from mlx_jupyter.cluster.cells.debug import DebugSessions


class FakeRun:
    ranks = [0, 1, 2]

    def __init__(self) -> None:
        self.answers: list[tuple[int, Optional[str]]] = []

    def answer_debug(self, rank: int, line: Optional[str]) -> None:
        self.answers.append((rank, line))


def sessions(replies: dict[str, Optional[str]]) -> tuple[DebugSessions, FakeRun, list[str], list[str]]:
    run, shown, asked = FakeRun(), [], []

    def ask(prompt: str) -> Optional[str]:
        asked.append(prompt)
        return replies.get(prompt, "c")

    return DebugSessions(run, shown.append, ask), run, shown, asked


def test_a_second_rank_waits_until_the_first_session_ends():
    s, run, shown, asked = sessions({})
    s.event(1, "> line 4\n", "(Pdb rank 1) ")
    s.event(0, "> line 4\n", "(Pdb rank 0) ")  # held: rank 1 has the notebook
    assert asked == ["(Pdb rank 1) "]
    s.event(1, "", "(Pdb rank 1) ")
    assert asked == ["(Pdb rank 1) "] * 2
    s.event(1, "", None, True)  # rank 1 continued: rank 0's prompt comes now
    assert asked == ["(Pdb rank 1) "] * 2 + ["(Pdb rank 0) "]
    assert [r for r, _ in run.answers] == [1, 1, 0]
    assert sum("--- pdb on rank" in line for line in shown) == 2
    assert "--- pdb on rank 1; ranks 0,2 go on until blocked" in shown[0]


def test_a_rank_whose_cell_ended_releases_the_notebook():
    s, run, _, asked = sessions({})
    s.event(2, "", "(Pdb rank 2) ")
    s.event(0, "", "(Pdb rank 0) ")
    s.rank_ended(2)
    assert asked == ["(Pdb rank 2) ", "(Pdb rank 0) "]


def test_no_stdin_says_so_and_lets_the_rank_go_on():
    run, shown = FakeRun(), []
    s = DebugSessions(run, shown.append, lambda prompt: None)
    s.event(1, "> here\n", "(Pdb rank 1) ")
    assert run.answers == [(1, None)]
    assert any("pdb cannot prompt here" in line for line in shown)


def test_after_the_stop_button_nothing_prompts():
    s, run, _, asked = sessions({})
    s.stopped = True
    s.event(1, "text\n", "(Pdb rank 1) ")
    assert asked == [] and run.answers == []
