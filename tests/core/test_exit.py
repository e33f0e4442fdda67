"""The interpreter exits cleanly while daemon threads go in and out of core calls.

CPython 3.11-3.13 ends a thread that takes the GIL back during finalization with a forced
unwind, which a C++ call frame turns into abort(); such threads now park until the process ends
(bindings_exit.cpp). Without that, about one exit in three aborted here."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

pytestmark = pytest.mark.timeout(120)

SCRIPT = textwrap.dedent("""
    import threading
    import numpy as np
    from mlx_jupyter import _core
    from mlx_jupyter.collective.group import CoreGroup
    from mlx_jupyter.vocab.hosts import Address
    from mlx_jupyter.vocab.ports import free_port_block

    base = free_port_block(2)
    addresses = [[Address("127.0.0.1", base + r)] for r in range(2)]
    started = threading.Barrier(3)

    def rank(r):
        group = CoreGroup(_core.Group.world(r, addresses, _core.CoreOptions(token="t"), 20), "ring", 20)
        x = np.ones(16, np.float32)
        out = np.empty_like(x)
        started.wait()
        while True:
            group.all_reduce("sum", x, out, None)

    for r in range(2):
        threading.Thread(target=rank, args=(r,), daemon=True).start()
    started.wait()   # both threads are in their loop of calls: exit now
    print("exiting", flush=True)
""")


def test_exit_with_daemon_threads_in_core_calls_is_clean():
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH", "")]))}
    for attempt in range(8):
        done = subprocess.run([sys.executable, "-c", SCRIPT], capture_output=True, text=True, timeout=60, env=env)
        assert done.returncode == 0 and done.stdout == "exiting\n", (
            f"exit {attempt + 1}: code {done.returncode}\n{done.stderr[-3000:]}")
        assert "terminate" not in done.stderr and "leaked" not in done.stderr, done.stderr[-3000:]
