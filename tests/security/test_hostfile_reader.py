"""The panel's hostfile reader (server/hostfile_field.py): confined, capped, off the event loop, bounded in time."""

from __future__ import annotations

import asyncio
import json
import os
import stat
import threading

import pytest

from mlx_jupyter.server import hostfile_field
from mlx_jupyter.server.hostfile_field import HostfileReader
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
        assert refusal(reader, "null.json").startswith("hostfile: 'null.json' is not a regular file")
    (root / "big.json").write_bytes(b" " * (hostfile_field.MAX_BYTES + 1))
    assert "larger than 1024 KiB" in refusal(reader, "big.json")
    (root / ".hidden").mkdir()
    (root / ".hidden" / "h.json").write_text(GOOD)
    assert "is hidden" in refusal(reader, ".hidden/h.json")
    assert "is not a regular file" in refusal(reader, ".")


def test_a_read_that_hangs_times_out_and_the_loop_keeps_running(reader, monkeypatch):
    """A hung network mount, stood in for by a read that blocks until released: the request gets
    its answer after the timeout, the loop serves others meanwhile; once READERS reads hang, the
    next is refused at once, and a hung read that returns frees its place."""
    release = threading.Event()
    real_read = HostfileReader._read
    monkeypatch.setattr(HostfileReader, "_read",
                        lambda self, name, path: release.wait(30) and real_read(self, name, path))
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
        hung = await asyncio.gather(*(reader.read("h.json") for _ in range(hostfile_field.READERS)), return_exceptions=True)
        took = loop.time() - started
        refused = await asyncio.gather(reader.read("h.json"), return_exceptions=True)
        t.cancel()
        release.set()
        while reader._hung:   # the released threads report back through the loop
            await asyncio.sleep(0.01)
        again = await reader.read("h.json")
        return hung, refused, took, ticks, again

    hung, refused, took, ticks, again = asyncio.run(go())
    assert all(isinstance(r, RequestError) and "could not be read within 1 s" in str(r) for r in hung), hung
    assert isinstance(refused[0], RequestError) and "2 earlier hostfile reads are still hanging" in str(refused[0])
    assert took < 5 and ticks > 20   # the loop ran all along
    assert [h.ssh for h in again.hostfile.hosts] == ["127.0.0.1"]


def test_reads_at_the_same_time_are_not_taken_for_hanging_ones(reader):
    """Issue 31: with 3 or more overlapping reads, the 4th was refused as 'still hanging' though none hung."""
    for i in range(8):
        (reader.root_path / f"h{i}.json").write_text(GOOD)

    async def go():
        return await asyncio.gather(*(reader.read(f"h{i}.json") for i in range(8)), return_exceptions=True)

    results = asyncio.run(go())
    assert [type(r).__name__ for r in results] == ["CheckedHostfile"] * 8, results
