"""The notebook's side of the ranks' pdb sessions, alone: who prompts when, and the no-stdin path."""

from __future__ import annotations

from typing import Optional

from mlx_jupyter.cluster.cells.debug import DebugSessions


class FakeRun:
    ranks = [0, 1, 2]
    via = "channel"   # its ranks' pdbs answer on the cell channel (answer_debug)

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


def test_ranks_that_stop_together_share_one_prompt():
    s, run, shown, asked = sessions({"(Pdb ranks 0-2) ": "p loss"})
    s.gather = 60  # the first prompt waits for the other running ranks (not for the clock)
    s.event(1, "> line 4\n", "(Pdb rank 1) ")
    s.event(0, "> line 4\n", "(Pdb rank 0) ")
    assert asked == []
    s.event(2, "> line 4\n", "(Pdb rank 2) ")
    assert asked == ["(Pdb ranks 0-2) "]
    assert sorted(run.answers) == [(0, "p loss"), (1, "p loss"), (2, "p loss")]
    assert "--- pdb on ranks 0-2 together" in shown[0] and "[ranks 0-2] > line 4\n" in shown[1]
    s.event(0, "3.0\n", "(Pdb rank 0) ")
    s.event(2, "nan\n", "(Pdb rank 2) ")
    assert len(asked) == 1  # rank 1 has not answered yet
    s.event(1, "3.0\n", "(Pdb rank 1) ")
    assert shown[2] == "[ranks 0-1] 3.0\n[rank 2] nan\n" and len(asked) == 2


def test_rank_prefix_talks_to_some_ranks_and_moves_go_to_all():
    replies = iter(["rank 2", "rank 5 p x", "ranks 0, 2 p x", "rank 2 n", "rank 2 p x", "c"])
    run, shown, asked = FakeRun(), [], []
    s = DebugSessions(run, shown.append, lambda p: (asked.append(p), next(replies))[1])
    for r in (0, 1, 2):
        s.event(r, "", f"(Pdb rank {r}) ")
    assert run.answers == [(2, "p x")]  # the three refused lines said why and asked again
    text = "".join(shown)
    assert "rank 2 what?" in text and "no rank 5" in text and "'n' moves ranks" in text
    assert "cannot read the ranks '0,': write them as 2, 0,2 or 0-3" in text
    s.event(2, "7\n", "(Pdb rank 2) ")
    assert shown[-1] == "[rank 2] 7\n" and sorted(run.answers[1:]) == [(0, "c"), (1, "c"), (2, "c")]


def test_one_rank_alone_prompts_after_the_others_had_their_chance():
    s, run, shown, asked = sessions({})
    s.gather = 0
    s.event(1, "> line 4\n", "(Pdb rank 1) ")
    assert asked == ["(Pdb rank 1) "] and shown[1] == "> line 4\n"  # unlabelled: one rank's session
    assert "--- pdb on rank 1; ranks 0,2 go on until blocked" in shown[0]
    s.event(1, "", "(Pdb rank 1) ")  # its next prompt comes at once
    assert asked == ["(Pdb rank 1) "] * 2
    s.event(1, "", None, True)
    s.event(0, "", "(Pdb rank 0) ")  # a later session of its own
    assert asked[-1] == "(Pdb rank 0) " and sum("--- pdb on rank" in line for line in shown) == 2


def test_a_rank_whose_cell_ended_is_not_waited_for():
    s, run, _, asked = sessions({})
    s.gather = 60
    s.event(2, "", "(Pdb rank 2) ")
    s.event(0, "", "(Pdb rank 0) ")
    assert asked == []
    s.rank_ended(1)
    assert asked == ["(Pdb ranks 0,2) "]


def test_no_stdin_says_so_and_lets_the_rank_go_on():
    run, shown = FakeRun(), []
    s = DebugSessions(run, shown.append, lambda prompt: None, gather=0)
    s.event(1, "> here\n", "(Pdb rank 1) ")
    assert run.answers == [(1, None)]
    assert any("pdb cannot prompt here" in line for line in shown)


def test_after_the_stop_button_nothing_prompts():
    s, run, _, asked = sessions({})
    s.stopped = True
    s.event(1, "text\n", "(Pdb rank 1) ")
    assert asked == [] and run.answers == []


def test_a_rank_slow_to_answer_is_waited_for_a_while_then_joins_later():
    s, run, shown, asked = sessions({})
    s.gather = 60
    for r in (0, 1, 2):
        s.event(r, "", f"(Pdb rank {r}) ")
    assert asked == ["(Pdb ranks 0-2) "]  # answered "c": sent to all three
    s.settle = 60
    s.event(0, "", "(Pdb rank 0) ")
    s.event(1, "", "(Pdb rank 1) ")
    assert len(asked) == 1  # rank 2 is waited for
    s.settle = 0  # ... until it took longer than this
    s.tick()
    assert asked[-1] == "(Pdb ranks 0-1) " and "(rank 2 still runs the last command" in shown[-1]
    s.settle = 60
    s.event(2, "late\n", "(Pdb rank 2) ")  # joins the next prompt, once ranks 0-1 answered
    assert asked[-1] == "(Pdb ranks 0-1) "
    s.event(0, "", "(Pdb rank 0) ")
    s.event(1, "", "(Pdb rank 1) ")
    assert asked[-1] == "(Pdb ranks 0-2) " and "[rank 2] late\n" in shown


def test_no_stdin_lets_every_rank_go_on():
    run, shown = FakeRun(), []
    s = DebugSessions(run, shown.append, lambda prompt: None)
    for r in (0, 1, 2):
        s.event(r, "", f"(Pdb rank {r}) ")
    assert sorted(run.answers) == [(0, None), (1, None), (2, None)]
    assert sum("ranks 0-2: pdb cannot prompt here" in line for line in shown) == 1
