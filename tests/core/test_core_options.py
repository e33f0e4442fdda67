"""The core's settings come in a CoreOptions when a world or a split is made (the core reads no
environment variable), so one process can hold worlds with different settings: here every rank
of a world is a thread of this test process."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from typing import Any, Callable, Sequence

import numpy as np
import pytest

from mlx_jupyter import _core
from mlx_jupyter.collective.group import CoreGroup, core_options
from mlx_jupyter.vocab.rank_env import read
from mlx_jupyter.vocab.hosts import Address
from mlx_jupyter.vocab.ports import free_port_block

import thread_ranks

TIMEOUT = 30.0


def in_threads(options: Sequence[_core.CoreOptions], body: Callable[[CoreGroup], Any]) -> list[Any]:
    """Forms a world of len(options) ranks, rank r a thread of this process with options[r], runs
    body(group) on each, closes the world; returns the bodies' results in rank order."""
    return thread_ranks.in_threads(options, body, TIMEOUT)[0]


def summed(group: CoreGroup, count: int = 16) -> tuple[list[str], bool]:
    """One all_sum of `count` float32 per rank: the links it used, and whether the sum was right."""
    n, x = group.size(), np.full(count, group.rank() + 1, np.float32)
    out = group.all_reduce("sum", x, None, None)
    return sorted(group.link_kinds()), bool((out == n * (n + 1) / 2).all())


def test_environment_fills_the_options():
    o = core_options(read({"MLX_JUPYTER_TOKEN": "t", "MLX_JUPYTER_TRANSPORT": "tcp", "MLX_JUPYTER_SHM": "named",
                           "MLX_JUPYTER_BOARD": "0", "MLX_JUPYTER_DEAD_PEER_TIMEOUT": "2.5",
                           "MLX_JUPYTER_HOST_ID": "h", "MLX_RING_VERBOSE": "1"}))
    assert (o.token, o.shm, o.named_shm, o.board, o.dead_peer_timeout, o.host_id, o.verbose) == (
        "t", False, True, False, 2.5, "h", True)
    default = core_options(read({}))
    assert (default.shm, default.named_shm, default.board, default.dead_peer_timeout, default.host_id) == (
        True, False, True, 10.0, "")


@pytest.mark.parametrize("settings, kinds", [
    ({}, ["left:shm", "right:shm"]),
    ({"shm": False}, ["left:tcp", "right:tcp"]),
    ({"named_shm": True}, ["left:shm", "right:shm"]),  # macOS's mechanism, here too
])
def test_transport_settings_per_world_in_one_process(settings, kinds):
    results = in_threads([_core.CoreOptions(token="t", **settings)] * 2, summed)
    assert results == [(kinds, True)] * 2, results


def test_host_ids_fake_two_hosts_in_one_process():
    # ranks 0-1 on "host A", 2-3 on "host B": shared memory inside each, TCP between them
    options = [_core.CoreOptions(token="t", host_id=h) for h in "AABB"]
    results = in_threads(options, summed)
    assert [r[1] for r in results] == [True] * 4, results
    assert results[0][0] == ["left:tcp", "right:shm"] and results[1][0] == ["left:shm", "right:tcp"], results


@pytest.mark.parametrize("board", [True, False])
def test_the_board_is_a_setting(board):
    results = in_threads([_core.CoreOptions(token="t", board=board)] * 3, summed)
    assert all(ok and ("board:shm" in kinds) is board for kinds, ok in results), results


def test_a_split_takes_its_own_options_but_keeps_the_worlds_token():
    def body(group: CoreGroup) -> Any:
        no_board = group.options
        no_board.board = False
        no_board.token = "ignored: connections keep the world's"
        ring = group.split(0, options=no_board)
        return summed(group), summed(ring), ring.options.board, ring.options.token, group.options.board

    for world, split, split_board, split_token, world_board in in_threads([_core.CoreOptions(token="t")] * 3, body):
        assert world[1] and "board:shm" in world[0]
        assert split[1] and "board:shm" not in split[0]
        assert (split_board, split_token, world_board) == (False, "t", True)


@pytest.mark.parametrize("limit", [0, 1 << 20])
def test_the_small_message_limit_is_a_setting(limit):
    # no board: small sums gather round the ring up to the limit, larger ones take the pipelined ring
    options = [_core.CoreOptions(token="t", board=False, small_limit=limit)] * 3
    results = in_threads(options, lambda g: [summed(g, count)[1] for count in (6, 1000, 50000)])
    assert results == [[True] * 3] * 3, results


def test_a_rank_with_another_token_is_refused():
    options = [_core.CoreOptions(token="ours"), _core.CoreOptions(token="theirs")]
    n, base = 2, free_port_block(2)
    addresses = [[Address("127.0.0.1", base + r)] for r in range(n)]

    def rank(r: int) -> str:
        try:
            _core.Group.world(r, addresses, options[r], 3.0).close("unexpected")
            return "formed"
        except _core.DistributedError as exc:
            return type(exc).__name__

    with ThreadPoolExecutor(n) as pool:
        outcomes = list(pool.map(rank, range(n)))
    assert "formed" not in outcomes, outcomes
