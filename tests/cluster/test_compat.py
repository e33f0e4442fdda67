"""The third-party internals we use are checked up front, and a missing one fails loudly naming the fix."""

from __future__ import annotations

from types import SimpleNamespace

import ipyparallel as ipp
import pytest

from mlx_jupyter.cluster import ClusterError
from mlx_jupyter.cluster.shared import ipp_compat
from mlx_jupyter.cluster.rank import agent, kernel_compat


def full_kernel(**drop: bool) -> SimpleNamespace:
    """A stand-in engine kernel with every internal the agent uses, minus those named in ``drop``."""
    attrs = {name: object() for name in kernel_compat.KERNEL_NEEDS}
    for name in drop:
        attrs.pop(name)
    return SimpleNamespace(**attrs)


def test_a_kernel_without_its_asyncio_lock_is_refused_naming_the_fix(monkeypatch):
    """Without ipykernel's lock a direct-channel cell could overtake a %px request: refuse, don't degrade."""
    monkeypatch.setattr(agent, "AGENT", None)
    with pytest.raises(RuntimeError) as err:
        agent.install(full_kernel(_main_asyncio_lock=True), rank=0)
    msg = str(err.value)
    assert "_main_asyncio_lock" in msg and "pip install 'ipykernel>=7,<8'" in msg, msg
    assert agent.AGENT is None


def test_every_missing_kernel_internal_is_named():
    assert kernel_compat.kernel_problems(full_kernel()) == []
    assert kernel_compat.kernel_problems(full_kernel(_send_abort_reply=True, aborted=True)) == [
        "aborted", "_send_abort_reply"]


def test_the_installed_ipykernel_has_the_lock():
    """The pinned ipykernel creates the lock the cell channel takes (checked on the class's annotations:
    it is set per instance)."""
    from ipykernel.kernelbase import Kernel

    assert "_main_asyncio_lock" in Kernel.__annotations__


def test_the_installed_ipyparallel_has_what_we_use():
    assert ipp_compat.ipyparallel_problems() == []


def test_a_missing_ipyparallel_internal_is_named_with_the_fix(monkeypatch):
    monkeypatch.delattr(ipp.Client, "send_execute_request")
    with pytest.raises(ClusterError) as err:
        ipp_compat.check_ipyparallel()
    msg = str(err.value)
    assert "Client.send_execute_request" in msg and "pip install 'ipyparallel>=9,<10'" in msg, msg


def test_our_controller_and_engine_find_what_they_extend():
    assert ipp_compat.subclass_problems("controller") == []
    assert ipp_compat.subclass_problems("engine") == []


def test_an_engine_missing_a_hook_exits_naming_the_fix(monkeypatch, capsys):
    from ipyparallel.engine.app import IPEngine

    monkeypatch.delattr(IPEngine, "complete_registration")
    with pytest.raises(SystemExit) as exited:
        ipp_compat.exit_unless_usable("engine")
    assert exited.value.code == 1
    err = capsys.readouterr().err
    assert "IPEngine.complete_registration" in err and "pip install 'ipyparallel>=9,<10'" in err, err
