"""Start's probes: one the controller dropped (sent before the engine's connection was up) is
re-sent, and the lost one never makes the cell channel look busy afterwards."""

from __future__ import annotations

import json
import time
from concurrent.futures import Future
from types import SimpleNamespace

from mlx_jupyter.cluster.controller_link import ControllerLink
from mlx_jupyter.cluster.rank_table import RankTable
from mlx_jupyter.cluster.shared.ipp_compat import requests_outstanding
from mlx_jupyter.cluster.startup import StartupSequence, probe_answer


class DroppingClient:
    """Stands in for ipyparallel's client: each rank's first probe is lost (never answered),
    the second is answered; the lost one stays in the per-engine outstanding lists, as in ipyparallel."""

    def __init__(self, size: int):
        self._engines = {r: f"uuid-{r}" for r in range(size)}
        self._outstanding_dict = {u: set() for u in self._engines.values()}
        self.sent: dict[int, int] = {r: 0 for r in range(size)}

    def direct_view(self, targets: int) -> SimpleNamespace:
        def execute(code, silent, block):
            assert silent and not block, (silent, block)
            self.sent[targets] += 1
            fut: Future = Future()
            fut.msg_ids = [f"probe-{targets}-{self.sent[targets]}"]
            if self.sent[targets] == 1:
                self._outstanding_dict[self._engines[targets]].add(fut.msg_ids[0])
            else:
                fut.set_result(None)  # the probe's code ran: the agent is installed
            return fut

        return SimpleNamespace(execute=execute)


def test_a_dropped_probe_does_not_keep_cells_off_the_channel():
    link, table = ControllerLink(), RankTable()
    link.client = client = DroppingClient(2)
    table.size = 2
    StartupSequence(link, table, "ring").probe_channels(time.monotonic() + 5)
    assert client.sent == {0: 2, 1: 2}  # each rank's probe was sent again after the first got no answer
    assert link.stray_probes == {"probe-0-1", "probe-1-1"}
    assert requests_outstanding(client, [0, 1])  # ipyparallel still lists them ...
    assert not link.requests_on([0, 1])  # ... but they are not requests a cell could overtake
    client._outstanding_dict["uuid-1"].add("a-px-request")
    assert link.requests_on([0, 1]) and not link.requests_on([0])


def test_a_probe_answer_carries_the_agent_state_or_says_the_probe_failed():
    class RemoteError(Exception):  # as ipyparallel's: the rank's exception text in .evalue
        def __init__(self, evalue: str):
            super().__init__(evalue)
            self.evalue = evalue

    def answered(result=None, exc=None) -> Future:
        f: Future = Future()
        f.set_exception(exc) if exc else f.set_result(result)
        return f

    state = {"installed": False, "ipyparallel": "9.0.1", "error": "no control_handlers"}
    assert probe_answer(answered()) == {"installed": True}
    assert probe_answer(answered(exc=RemoteError(json.dumps(state)))) == state
    for odd in ("NameError: name 'x' is not defined", json.dumps([1]), ""):
        got = probe_answer(answered(exc=RemoteError(odd)))
        assert not got["installed"] and got["error"].startswith("the probe failed"), got
