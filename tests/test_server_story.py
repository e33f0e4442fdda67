"""One story in three places (issue 45 §6): what the lab panel's card and the dashboard say of a cluster comes from
the server's one look (server/live.py), in the words of the cell's own table and messages: a rank that finished its
part of a hung cell is "done" there too, the headline names the same op, number, line and culprit as the cell, and
MLX's `world` shut down is said with how to restart, in the words the cell's refusal uses."""

from __future__ import annotations

from mlx_jupyter.cluster.restart_context import owner_restart
from mlx_jupyter.cluster.shared import world_words
from mlx_jupyter.server.live import LiveState, story
from mlx_jupyter.where import model

#: rank 0 evaluates MLX's all_sum #1 at line 4 for 3 s; rank 1 never made it (its cell ended)
RECORD = {"counts": {"world": 1}, "groups": {"world": [0, 2]},
          "calls": [{"key": "world", "seq": 1, "op": "all_sum", "dtype": "float32", "shape": [4], "peer": None,
                     "at": "line 4", "via": None}]}
WAITING = {"rank": 0, "running": True, "cell": 7, "line": 4, "source": "mx.eval(y)", "call": "mx.eval", "mlx": RECORD,
           "mlx_eval": "mx.eval", "still": 3.0, "activity": []}


def kernels_rows() -> list[dict]:
    """A kernel's cluster as the registry lists it: both ranks running the cell (the owner's listing lags)."""
    return [{"rank": r, "health": "ok", "state": "running a cell"} for r in (0, 1)]


def test_a_hung_cell_the_panel_and_the_cell_say_alike():
    cell_rows = model.rows({0: WAITING, 1: {"rank": 1, "running": True, "line": 2}}, {1: "done"}, [0, 1])
    cell_says = model.diagnosis(cell_rows)
    assert cell_says.startswith("rank 0 waits in MLX all_sum #1 (float32[4], built at line 4"), cell_says
    rows = kernels_rows()
    look = LiveState().look(100.0, rows, {0: WAITING, 1: {"rank": 1, "running": False, "cell": 7}}, say_no_reply=False)
    assert look.headline == cell_says, (look.headline, cell_says)
    assert look.story == "running a cell on rank 0; done on rank 1", look.story
    assert [r["where"] for r in rows] == [cell_rows[0].state, "done"] and rows[1]["state"] == "done"


def test_a_rank_idle_while_others_run_is_done_only_when_it_ran_that_cell():
    """Rank 1 did not run rank 0's cell (--targets 0: its count of requests is behind): idle, not done; the panel's
    own cluster has no listing, the ranks' numbers say it; without them, the owner's listing does."""
    running = {"rank": 0, "running": True, "line": 2, "cell": 5}
    for rows, idle, said in (
            ([{"rank": r, "health": "ok", "state": "idle"} for r in (0, 1)], {"rank": 1, "running": False, "cell": 4},
             "idle"),
            ([{"rank": r, "health": "ok", "state": "busy" if r == 0 else "idle"} for r in (0, 1)],
             {"rank": 1, "running": False, "cell": 5}, "done"),
            ([{"rank": 0, "health": "ok", "state": "running a cell"}, {"rank": 1, "health": "ok", "state": "idle"}],
             {"rank": 1, "running": False}, "idle"),
            ([{"rank": r, "health": "ok", "state": "running a cell"} for r in (0, 1)], {"rank": 1, "running": False},
             "done")):
        look = LiveState().look(1.0, rows, {0: dict(running), 1: idle})
        assert rows[1]["where"] == said, (rows, idle)
        assert look.story == "running a cell on rank 0" + ("; done on rank 1" if said == "done" else ""), look


def test_world_shut_down_is_said_with_how_to_restart():
    """After an interrupt that shut MLX's world down on rank 0: not "idle" alone but the cell's words and the restart."""
    why = "rank 1 raised ZeroDivisionError: division by zero"
    samples = {0: {"rank": 0, "running": False, "world_closed": why, "world_dead": ""},
               1: {"rank": 1, "running": False, "world_closed": "", "world_dead": ""}}
    rows = [{"rank": r, "health": "ok", "state": "idle"} for r in (0, 1)]
    look = LiveState().look(1.0, rows, samples, restart=owner_restart(False))
    said = world_words.shut_down(world_words.reason("rank 0", why))
    assert look.story == (f"idle; {said}: for a new `world`, restart it in that kernel's notebook with "
                          "%mlx_cluster restart (it keeps the ranks' names)"), look.story
    assert said == f"MLX's `world` is shut down (shut down on rank 0 after: {why})"
    # once every rank was told (the next cell's settle), each rank's mark is the reason, in the same words
    marked = {r: {"rank": r, "running": False, "world_dead": world_words.reason("rank 0", why)} for r in (0, 1)}
    assert LiveState().look(2.0, rows, marked).story == f"idle; {said}"


def test_the_story_of_ranks_in_words():
    rows = [model.RankRow(0, "running line 3: x", ""), model.RankRow(1, "done", "done"), model.RankRow(2, "done", "done")]
    assert story(rows) == "running a cell on rank 0; done on ranks 1 and 2"
    assert story([model.RankRow(0, "idle", "idle")]) == "idle"
    assert story([model.RankRow(0, "dead", "dead")]) == ""
