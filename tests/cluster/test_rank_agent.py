"""RankAgent's interrupt: delivered to the cell it was meant for, never to the next request.

The agent runs in this (main) thread with a fake kernel; aborts come from another thread,
as they do from the engine's control thread.
"""

from __future__ import annotations

import ast
import signal
import threading
import time
from types import SimpleNamespace

import pytest

from mlx_jupyter.cluster.shared.connection_files import await_json_file
from mlx_jupyter.cluster.rank import agent as rankside
from mlx_jupyter.cluster.rank import sockets, world

pytestmark = pytest.mark.timeout(30)


@pytest.fixture
def agent():
    if threading.current_thread() is not threading.main_thread():
        pytest.skip("needs the main thread (signals)")
    saved = signal.getsignal(signal.SIGINT)
    signal.signal(signal.SIGINT, signal.default_int_handler)  # what ipykernel sets for each request
    shell = SimpleNamespace(user_ns={}, events=None, ast_transformers=[])
    parent = {"header": {"msg_id": ""}}
    kernel = SimpleNamespace(shell=shell, control_handlers={}, aborted=set(), parent=parent,
                             get_parent=lambda channel: parent)
    a = rankside.RankAgent(kernel, rank=0)
    try:
        yield a
    finally:
        signal.signal(signal.SIGINT, saved)


def run_python(seconds: float) -> None:
    """Bytecode in the main thread for a while: where a pending signal handler runs."""
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        pass


def abort_from_control_thread(a: rankside.RankAgent, reason: str = "test", msg_id: str = "") -> bool:
    box = {}
    t = threading.Thread(target=lambda: box.setdefault("ran", a.abort(reason, msg_id)))
    t.start()
    t.join(5)
    assert not t.is_alive()
    return box["ran"]


def test_abort_interrupts_the_running_cell(agent):
    agent._pre_run_cell()
    with pytest.raises(KeyboardInterrupt):
        assert abort_from_control_thread(agent) is True
        run_python(2.0)
    agent._post_run_cell()
    assert not agent.executing and agent.abort_reason == "test"


def test_late_interrupt_is_not_delivered_to_the_next_cell(agent, monkeypatch):
    """The reviewer's race: the check says cell 1 runs, the signal arrives once cell 2 runs."""
    held = []
    real_kill = signal.pthread_kill
    monkeypatch.setattr(signal, "pthread_kill", lambda tid, sig: held.append((tid, sig)))
    agent._pre_run_cell()                      # cell 1
    assert abort_from_control_thread(agent) is True
    agent._post_run_cell()                     # cell 1 ends before the signal arrives
    agent._pre_run_cell()                      # cell 2
    monkeypatch.setattr(signal, "pthread_kill", real_kill)
    [(tid, sig)] = held
    real_kill(tid, sig)                        # the signal meant for cell 1, late
    run_python(0.3)                            # no KeyboardInterrupt in cell 2
    with pytest.raises(KeyboardInterrupt):     # while an abort of cell 2 still stops it
        abort_from_control_thread(agent)
        run_python(2.0)
    agent._post_run_cell()


def test_late_interrupt_between_cells_and_in_post_run_cell_is_dropped(agent, monkeypatch):
    held = []
    real_kill = signal.pthread_kill
    monkeypatch.setattr(signal, "pthread_kill", lambda tid, sig: held.append((tid, sig)))
    agent._pre_run_cell()
    assert abort_from_control_thread(agent) is True
    agent._post_run_cell()
    monkeypatch.setattr(signal, "pthread_kill", real_kill)
    real_kill(*held[0])                        # arrives after the cell, before any other
    run_python(0.3)
    assert agent.interrupt.target is None      # handled, and dropped


def test_an_outside_sigint_still_interrupts(agent):
    """A SIGINT the agent did not send (the launcher's, the user's) keeps its usual effect."""
    agent._pre_run_cell()
    with pytest.raises(KeyboardInterrupt):
        signal.pthread_kill(threading.main_thread().ident, signal.SIGINT)
        run_python(2.0)
    agent._post_run_cell()


def test_no_signal_when_no_cell_runs(agent, monkeypatch):
    sent = []
    monkeypatch.setattr(signal, "pthread_kill", lambda *a: sent.append(a))
    assert abort_from_control_thread(agent) is False
    agent._pre_run_cell()
    agent._post_run_cell()
    assert abort_from_control_thread(agent) is False
    assert sent == []


def start_cell(a: rankside.RankAgent, msg_id: str) -> None:
    """What the kernel does for request ``msg_id``: make it the shell's parent, then pre_run_cell."""
    a.kernel.parent["header"]["msg_id"] = msg_id
    a._pre_run_cell()


def test_abort_of_a_queued_cell_keeps_it_from_running(agent, monkeypatch):
    """The abort reaches a rank before the cell it names started there (still queued)."""
    sent = []
    monkeypatch.setattr(signal, "pthread_kill", lambda *a: sent.append(a))
    assert abort_from_control_thread(agent, "rank 0 raised X", msg_id="m2") is False
    assert "m2" in agent.kernel.aborted          # ipyparallel's kernel answers "aborted"
    assert sent == []


def test_abort_of_a_cell_already_dispatched_rejects_it_before_its_first_line(agent, monkeypatch):
    """The kernel took the request before the abort came (between dispatch and pre_run_cell)."""
    monkeypatch.setattr(signal, "pthread_kill", lambda *a: pytest.fail("no signal expected"))
    assert abort_from_control_thread(agent, "stop", msg_id="m3") is False
    start_cell(agent, "m3")
    assert "m3" not in agent.kernel.aborted
    [rejector] = agent.shell.ast_transformers
    with pytest.raises(rankside.CellAborted, match="not run: stop"):
        rejector.visit(ast.parse("x = 1"))
    assert agent.shell.ast_transformers == []
    agent._post_run_cell()
    assert agent.abort_reason == "stop"
    start_cell(agent, "m4")                       # the next cell runs as usual
    assert agent.shell.ast_transformers == [] and agent.abort_reason is None
    agent._post_run_cell()


def test_rejector_of_a_cell_that_never_compiled_is_removed(agent):
    abort_from_control_thread(agent, "stop", msg_id="m5")
    start_cell(agent, "m5")
    agent._post_run_cell()                        # a syntax error: no AST transform ran
    assert agent.shell.ast_transformers == []


def test_abort_naming_another_cell_does_not_interrupt_the_running_one(agent, monkeypatch):
    sent = []
    monkeypatch.setattr(signal, "pthread_kill", lambda *a: sent.append(a))
    start_cell(agent, "m6")
    assert abort_from_control_thread(agent, "stop", msg_id="m7") is False
    assert sent == [] and agent.shell.ast_transformers == []
    agent._post_run_cell()
    start_cell(agent, "m7")
    assert len(agent.shell.ast_transformers) == 1
    agent._post_run_cell()


def test_abort_of_a_cell_that_already_ended_is_a_no_op(agent, monkeypatch):
    monkeypatch.setattr(signal, "pthread_kill", lambda *a: pytest.fail("no signal expected"))
    start_cell(agent, "m8")
    agent._post_run_cell()
    start_cell(agent, "m9")
    agent._post_run_cell()
    assert abort_from_control_thread(agent, "late", msg_id="m8") is False
    assert "m8" not in agent.kernel.aborted and not agent._not_started


class _Group:
    """The product's core group as the agent sees it: records aborts."""

    def __init__(self) -> None:
        self.aborts: list[str] = []
        self.aborted = False

    def abort(self, reason: str) -> None:
        self.aborts.append(reason)
        self.aborted = True


@pytest.fixture
def product_group(monkeypatch):
    from mlx_jupyter.cluster.rank import names

    group = _Group()
    monkeypatch.setattr(names.NAMES, "group", group)
    return group


def _ended(result_error=None, before_exec=None):
    return SimpleNamespace(error_in_exec=result_error, error_before_exec=before_exec)


def test_an_abort_kills_no_group_by_itself(agent, product_group, monkeypatch):
    """Running Python, or already ended: the interrupt is enough (an op of our core that it stops
    aborts its group itself); the group the user or the product made is left alone."""
    monkeypatch.setattr(signal, "pthread_kill", lambda *a: None)
    start_cell(agent, "m10")
    assert abort_from_control_thread(agent, "stop", msg_id="m10") is True
    agent._post_run_cell()
    assert abort_from_control_thread(agent, "late", msg_id="m10") is False  # ended: a no-op
    assert product_group.aborts == []


def test_an_unsupervised_cell_that_raised_while_running_releases_its_peers(agent, product_group):
    """``%px`` (nobody supervises it): an error in the cell's code aborts the product's group at once."""
    start_cell(agent, "m11")
    agent._post_run_cell(_ended(ZeroDivisionError("x")))
    assert product_group.aborts == ["rank 0 raised ZeroDivisionError: x"]


def test_a_syntax_error_or_a_supervised_cells_error_aborts_nothing(agent, product_group):
    """A cell that never ran left nobody waiting; a supervised one's run decides (it releases the
    ranks still running and forms again only what the ranks say was aborted)."""
    start_cell(agent, "m12")
    agent._post_run_cell(_ended(before_exec=SyntaxError("incomplete input")))
    agent.kernel.parent["header"]["session"] = rankside.CHANNEL_SESSION  # a cell from the cell channel
    start_cell(agent, "m13")
    agent._post_run_cell(_ended(ValueError("only rank 1")))
    agent.kernel.parent["header"].pop("session")
    agent.kernel.parent["metadata"] = {"label": rankside.SUPERVISED_LABEL}  # one sent through the controller
    start_cell(agent, "m14")
    agent._post_run_cell(_ended(ValueError("only rank 1")))
    assert product_group.aborts == []
    assert agent.status()["group_aborted"] is False


def test_world_sockets_are_those_on_the_hostfiles_ports(tmp_path, monkeypatch):
    """Sockets other threads open meanwhile (the engine's ZMQ) are never taken for MLX's."""
    import json
    import socket

    before = sockets.socket_fds()
    ring = socket.create_server(("127.0.0.1", 0))
    other = socket.create_server(("127.0.0.1", 0))
    peer = socket.create_connection(ring.getsockname())
    accepted, _ = ring.accept()
    try:
        hostfile = tmp_path / "hosts.json"
        hostfile.write_text(json.dumps([[f"127.0.0.1:{ring.getsockname()[1]}"], ["127.0.0.1:1"]]))
        found = set(sockets.world_socket_fds(before, str(hostfile)))
        assert {ring.fileno(), peer.fileno(), accepted.fileno()} <= found
        assert other.fileno() not in found
    finally:
        for s in (ring, other, peer, accepted):
            s.close()


def test_setup_waits_for_the_early_world_with_a_timeout_naming_it(monkeypatch):
    never = SimpleNamespace(backend="ring", done=threading.Event(), error=None, group=None, sockets={})
    monkeypatch.setattr(world, "EARLY_WORLD", never)
    with pytest.raises(TimeoutError, match="MLX's world group did not form within 0.1 s"):
        world._form_world("ring", 0.1)


def test_an_early_world_that_failed_is_reported_once_then_formed_again(monkeypatch):
    failed = SimpleNamespace(backend="ring", done=threading.Event(), error=RuntimeError("[ring] Couldn't bind socket"),
                             group=None, sockets={})
    failed.done.set()
    monkeypatch.setattr(world, "EARLY_WORLD", failed)
    with pytest.raises(RuntimeError, match="bind"):
        world._form_world("ring", 1)
    assert world.EARLY_WORLD is None


def test_without_a_hostfile_no_socket_is_taken_for_mlx(monkeypatch):
    """MPI, NCCL: their sockets cannot be told from the engine's; none is ever shut (MPI's job aborted)."""
    import socket

    before = sockets.socket_fds()
    s = socket.create_server(("127.0.0.1", 0))
    try:
        assert sockets.world_socket_fds(before, "") == {}
    finally:
        s.close()


def test_status_carries_the_current_cells_start(agent, monkeypatch):
    """`cell_started`: the wall clock when the current request began; None between requests."""
    agent.shell.user_ns = {}
    assert agent.status()["cell_started"] is None
    monkeypatch.setattr(rankside.time, "time", lambda: 1234.5)
    agent._pre_run_cell()
    monkeypatch.undo()
    st = agent.status()
    assert st["executing"] and st["cell_started"] == 1234.5 and st["time"] >= 1234.5
    agent._post_run_cell()
    assert agent.status()["cell_started"] is None


def test_a_remote_ranks_cell_start_is_moved_to_our_clock(monkeypatch):
    from mlx_jupyter.cluster.rank_control import _local_clock

    monkeypatch.setattr("mlx_jupyter.cluster.rank_control.time.time", lambda: 1000.0)
    busy = {"executing": True, "cell_started": 1500.0, "time": 1510.0}  # its clock is 510 s ahead
    assert _local_clock(busy, same_clock=True) == 1500.0
    assert _local_clock(busy, same_clock=False) == 990.0
    assert _local_clock({**busy, "executing": False}, same_clock=False) is None
    assert _local_clock({"executing": True, "cell_started": 5.0}, same_clock=False) == 5.0  # an older rank


# ---------------------------------------------------------------- the early world's order


def _hostfile(tmp_path, addrs) -> str:
    import json

    path = tmp_path / "hosts.json"
    path.write_text(json.dumps([[a] if isinstance(a, str) else a for a in addrs]))
    return str(path)


def test_only_the_last_local_ring_rank_waits_for_the_others(tmp_path):
    hf = _hostfile(tmp_path, ["127.0.0.1:5000", ["127.0.0.1:5010", "127.0.0.1:5011"], "127.0.0.1:5020"])
    assert sockets.ring_ports_to_await(2, hf) == {5000, 5010}  # the first address each accepts on
    assert sockets.ring_ports_to_await(0, hf) == set() and sockets.ring_ports_to_await(1, hf) == set()
    remote = _hostfile(tmp_path, ["127.0.0.1:5000", "10.0.0.2:5000"])
    assert sockets.ring_ports_to_await(1, remote) == set()  # cannot see another host's sockets
    assert sockets.ring_ports_to_await(0, _hostfile(tmp_path, ["127.0.0.1:5000"])) == set()
    assert sockets.ring_ports_to_await(1, str(tmp_path / "missing.json")) == set()


def test_ring_ports_to_await_never_raises_on_any_hostfile(tmp_path):
    import json

    from hypothesis import given, settings
    from hypothesis import strategies as st

    path = tmp_path / "h.json"
    anything = st.recursive(st.none() | st.booleans() | st.integers() | st.text(max_size=12),
                            lambda kids: st.lists(kids, max_size=4) | st.dictionaries(st.text(max_size=4), kids, max_size=3),
                            max_leaves=12)

    @settings(max_examples=200, deadline=None)
    @given(anything, st.integers(-2, 5))
    def check(doc, rank):
        path.write_text(json.dumps(doc))
        ports = sockets.ring_ports_to_await(rank, str(path))
        assert isinstance(ports, set) and all(isinstance(p, int) for p in ports)

    check()
    path.write_bytes(b"\xff not json")
    assert sockets.ring_ports_to_await(1, str(path)) == set()


def test_wait_listening_sees_a_listening_port_and_times_out_on_a_closed_one():
    import socket

    server = socket.create_server(("127.0.0.1", 0))
    probe = socket.socket()
    probe.bind(("127.0.0.1", 0))  # bound, never listening
    try:
        if sockets._listening_ports() is None:
            pytest.skip("this system does not let us list listening sockets")
        assert sockets.wait_listening({server.getsockname()[1]}, timeout=5)
        t0 = time.monotonic()
        assert not sockets.wait_listening({probe.getsockname()[1]}, timeout=0.1)
        assert time.monotonic() - t0 < 5
    finally:
        server.close()
        probe.close()


def test_the_early_world_waits_for_the_ports_before_mlx_init(monkeypatch):
    """MLX's init holds the GIL: the wait for the peers comes before it, in Python."""
    import mlx.core as mx

    order = []
    monkeypatch.setattr(world, "wait_listening", lambda ports, timeout: order.append(("wait", ports)) or True)
    monkeypatch.setattr(mx.distributed, "init", lambda strict, backend: order.append(("init", backend)) or "world")
    early = world.EarlyWorld("ring", strict=True, hostfile="", await_ports={5000})
    assert early.done.wait(10)
    assert order == [("wait", {5000}), ("init", "ring")] and early.group == "world" and early.error is None


def test_start_world_early_once_and_only_for_ring_ranks(monkeypatch):
    made = []
    monkeypatch.setattr(world, "EARLY_WORLD", None)
    monkeypatch.setattr(world, "EarlyWorld", lambda *a, **k: made.append((a, k)) or SimpleNamespace(done=threading.Event()))
    monkeypatch.setenv("MLX_JUPYTER_BACKEND", "jaccl")
    monkeypatch.setenv("MLX_JUPYTER_SIZE", "2")
    monkeypatch.setenv("MLX_HOSTFILE", "/nonexistent.json")
    monkeypatch.setenv("MLX_RANK", "1")
    assert world.start_world_early() is False and made == []
    monkeypatch.setenv("MLX_JUPYTER_BACKEND", "ring")
    monkeypatch.setenv("MLX_JUPYTER_EARLY_WORLD", "0")
    assert world.start_world_early() is False and made == []
    monkeypatch.delenv("MLX_JUPYTER_EARLY_WORLD")
    t0 = time.monotonic()
    assert world.start_world_early(wait=0.05) is True  # waits (bounded) for the world
    assert time.monotonic() - t0 >= 0.05
    world.EARLY_WORLD.done.set()
    assert world.start_world_early() is True
    assert len(made) == 1 and made[0][0] == ("ring",)


def test_await_json_file_waits_for_valid_json(tmp_path):
    path = tmp_path / "c.json"
    assert not await_json_file(str(path), 0.05)
    path.write_text('{"key": ')  # half written
    assert not await_json_file(str(path), 0.05)
    path.write_text('{"key": "k"}')
    assert await_json_file(str(path), 0.05)


def test_a_cell_aborted_before_it_began_is_the_drains_run_until_another_request_begins(agent):
    """A peer raised at once: this rank's abort came before its cell began (fresh clone #10's 4-rank failure:
    the drain took the rank for one that had moved on, and its peers' `world` was shut down). Idle, it owes
    that run the calls its peers wait in; once another request begins, it owes nothing."""
    from mlx_jupyter.cluster.rank import drain

    start_cell(agent, "m1")
    agent._post_run_cell()
    assert abort_from_control_thread(agent, "rank 1 raised", msg_id="m2") is False
    assert agent.never_began("m2") and not agent.never_began("m1") and not agent.never_began("")
    replies = []
    agent._reply = lambda stream, idents, parent, kind, content: replies.append(content)
    on_state = drain.handlers(agent)["mlx_drain_state_request"]
    on_state(None, None, {"content": {"msg_id": "m2"}})
    assert replies[-1]["this_run"] is True and replies[-1]["executing"] is False
    start_cell(agent, "m3")   # another request began (the aborted one was answered "aborted" unrun)
    assert not agent.never_began("m2")
    on_state(None, None, {"content": {"msg_id": "m2"}})
    assert replies[-1]["this_run"] is False
    agent._post_run_cell()
    assert not agent.never_began("m2")
