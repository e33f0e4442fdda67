"""The panel's hostfile reader (server/hostfiles.py): confined, capped, off the event loop, bounded in time."""

from __future__ import annotations

import asyncio
import json
import os
import stat
import threading

import pytest

from mlx_jupyter.server import hostfiles
from mlx_jupyter.server.hostfiles import HostfileReader
from mlx_jupyter.server.requests import RequestError

GOOD = json.dumps([{"ssh": "127.0.0.1", "ips": ["127.0.0.1"]}])


@pytest.fixture
def reader(tmp_path):
    root = tmp_path / "root"
    root.mkdir()
    r = HostfileReader(str(root), timeout=1.0)
    yield r
    r.close()


def refusal(reader, name: str) -> str:
    with pytest.raises(RequestError) as err:
        asyncio.run(reader.read(name))
    assert err.value.field == "hostfile"
    return str(err.value)


def test_a_good_file_is_copied_privately_and_the_copy_is_what_the_cluster_reads(reader):
    (reader.root_path / "h.json").write_text(GOOD)
    checked = asyncio.run(reader.read("h.json"))
    assert [h.ssh for h in checked.hostfile.hosts] == ["127.0.0.1"] and checked.name == "h.json"
    assert open(checked.copy).read() == GOOD and stat.S_IMODE(os.stat(checked.copy).st_mode) == 0o600
    (reader.root_path / "h.json").write_text("changed after the check")
    assert open(checked.copy).read() == GOOD


def test_devices_large_files_and_hidden_files_are_refused(reader, tmp_path):
    root = reader.root_path
    os.symlink("/dev/zero", root / "zero.json")
    assert "leads outside" in refusal(reader, "zero.json")
    if os.geteuid() == 0:   # a device node inside the root: refused before any read
        os.mknod(root / "null.json", stat.S_IFCHR | 0o600, os.makedev(1, 3))
        assert refusal(reader, "null.json") == "hostfile: 'null.json' is not a regular file"
    (root / "big.json").write_bytes(b" " * (hostfiles.MAX_BYTES + 1))
    assert "larger than 1024 KiB" in refusal(reader, "big.json")
    (root / ".hidden").mkdir()
    (root / ".hidden" / "h.json").write_text(GOOD)
    assert "is hidden" in refusal(reader, ".hidden/h.json")
    assert "is not a regular file" in refusal(reader, ".")


def test_a_read_that_hangs_times_out_and_the_loop_keeps_running(reader, monkeypatch):
    """A hung network mount, stood in for by a read that blocks until released: the request gets
    its answer after the timeout, the loop serves others meanwhile, and at most READERS reads hang."""
    release = threading.Event()
    monkeypatch.setattr(HostfileReader, "_read", lambda self, name, path: release.wait(30) and GOOD)
    (reader.root_path / "h.json").write_text(GOOD)

    async def go():
        ticks = 0

        async def ticker():
            nonlocal ticks
            while True:
                await asyncio.sleep(0.01)
                ticks += 1

        t = asyncio.ensure_future(ticker())
        loop = asyncio.get_running_loop()
        started = loop.time()
        results = await asyncio.gather(*(reader.read("h.json") for _ in range(hostfiles.READERS + 1)),
                                       return_exceptions=True)
        took = loop.time() - started
        t.cancel()
        release.set()
        return results, took, ticks

    results, took, ticks = asyncio.run(go())
    messages = sorted(str(r) for r in results)
    assert all(isinstance(r, RequestError) for r in results), results
    assert sum("could not be read within 1 s" in m for m in messages) == hostfiles.READERS, messages
    assert sum("earlier hostfile reads are still hanging" in m for m in messages) == 1, messages
    assert took < 5 and ticks > 20   # the loop ran all along
