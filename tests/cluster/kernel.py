"""A real IPython kernel driven through jupyter_client, for the cluster/magics tests."""

from __future__ import annotations

import os
import queue
import re
import statistics
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any, Callable, Optional

import psutil
from jupyter_client.manager import KernelManager


@dataclass
class CellResult:
    """What one execute_request produced."""

    status: str = ""
    stdout: str = ""
    stderr: str = ""
    displays: list = field(default_factory=list)
    widget_states: list = field(default_factory=list)  # every comm_open / comm_msg state, with its comm_id
    error: Optional[dict] = None
    elapsed: float = 0.0
    ended_at: float = 0.0  # time.monotonic() when the kernel said idle (the cell's end, as a frontend sees it)

    @property
    def traceback(self) -> str:
        tb = "\n".join(self.error["traceback"]) if self.error else ""
        return re.sub(r"\x1b\[[0-9;]*[A-Za-z]", "", tb)

    def absorb(self, kind: str, content: dict) -> bool:
        """Fold one iopub message of the cell into this result; True when it says the cell ended (idle)."""
        if kind == "stream":
            if content["name"] == "stdout":
                self.stdout += content["text"]
            else:
                self.stderr += content["text"]
        elif kind in ("display_data", "execute_result", "update_display_data"):
            self.displays.append(content)
        elif kind == "error":
            self.error = content
        elif kind in ("comm_open", "comm_msg"):
            state = (content.get("data") or {}).get("state")
            if state:
                self.widget_states.append({**state, "comm_id": content.get("comm_id")})
        elif kind == "status" and content["execution_state"] == "idle":
            self.ended_at = time.monotonic()
            return True
        return False


class Kernel:
    """Start with ``Kernel()``, run cells with :meth:`run`, ``close()`` at the end."""

    def __init__(self, env: Optional[dict] = None, startup_timeout: float = 30, kernel_name: Optional[str] = None):
        self.km = KernelManager(kernel_name=kernel_name or os.environ.get("TEST_KERNEL", "python3"))

        self.km.start_kernel(env={**os.environ, **(env or {})})
        self.kc = self.km.client()
        self.kc.start_channels()
        self.kc.wait_for_ready(timeout=startup_timeout)

    @property
    def pid(self) -> int:
        return self.km.provisioner.process.pid

    def submit(self, code: str) -> str:
        return self.kc.execute(code, allow_stdin=False)

    def collect(self, msg_id: str, timeout: float, on_output: Optional[Callable[[str, str], None]] = None) -> CellResult:
        """Gather iopub output of ``msg_id`` until idle; raise TimeoutError after ``timeout``."""
        res = CellResult()
        t0 = time.monotonic()
        deadline = t0 + timeout
        while True:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise TimeoutError(f"cell did not finish within {timeout} s; so far: {res}")
            try:
                msg = self.kc.get_iopub_msg(timeout=remaining)
            except queue.Empty:
                continue
            if msg["parent_header"].get("msg_id") != msg_id:
                continue
            kind, content = msg["msg_type"], msg["content"]
            if kind == "stream" and on_output:
                on_output(content["name"], content["text"])
            if res.absorb(kind, content):
                break
        res.status = self.reply(msg_id, max(1.0, deadline - time.monotonic()))["content"]["status"]
        res.elapsed = time.monotonic() - t0
        return res

    def reply(self, msg_id: str, timeout: float = 10) -> dict:
        """The shell channel's reply to ``msg_id`` (replies to earlier requests are skipped)."""
        reply = self.kc.get_shell_msg(timeout=timeout)
        while reply["parent_header"].get("msg_id") != msg_id:
            reply = self.kc.get_shell_msg(timeout=timeout)
        return reply

    def drain(self, msg_id: str, res: CellResult, on_msg: Optional[Callable[[dict], None]] = None) -> bool:
        """Absorbs into ``res`` the iopub messages of ``msg_id`` already here (``on_msg`` sees each);
        True once the cell went idle."""
        while True:
            try:
                msg = self.kc.get_iopub_msg(timeout=0.01)
            except queue.Empty:
                return False
            if msg["parent_header"].get("msg_id") != msg_id:
                continue
            if on_msg is not None:
                on_msg(msg)
            if res.absorb(msg["msg_type"], msg["content"]):
                return True

    def run(self, code: str, timeout: float = 30) -> CellResult:
        return self.collect(self.submit(code), timeout)

    def median_elapsed(self, code: str, n: int, timeout: float = 60) -> float:
        """Run ``code`` ``n`` times (each must succeed); the median round trip in seconds."""
        times = []
        for _ in range(n):
            res = self.run(code, timeout)
            assert res.status == "ok", res
            times.append(res.elapsed)
        return statistics.median(times)

    def interrupt(self) -> None:
        self.km.interrupt_kernel()

    def tree(self) -> set[int]:
        """The kernel's descendants now (controller, engines, ranks)."""
        try:
            return {p.pid for p in psutil.Process(self.pid).children(recursive=True)}
        except psutil.Error:
            return set()

    def close(self) -> None:
        """Shut the kernel down; whatever of its process tree is left (a failed test) is killed."""
        left: set[int] = set()
        try:
            left = self.tree()
            self.kc.stop_channels()
        finally:
            try:
                self.km.shutdown_kernel(now=False)
            finally:
                kill_leftovers(left)


def cluster_kernel(n: int, timeout: float = 90, stop: bool = False) -> Iterator[Kernel]:
    """A module fixture's body: a kernel with ``n`` local ranks started (within ``timeout`` s), closed at the end;
    with ``stop``, its cluster is stopped first (``%mlx_cluster stop``) when the tests passed through."""
    k = Kernel()
    try:
        res = k.run(f"%load_ext mlx_jupyter\n%mlx_cluster start -n {n}", timeout)
        assert res.status == "ok", res
        yield k
        if stop:
            k.run("%mlx_cluster stop", 30)
    finally:
        k.close()


def works(k: Kernel, n: int, timeout: float = 60) -> None:
    """The next cell runs on all ``n`` ranks, and a collective on the product's group gives the right sum."""
    res = k.run("%%mlx_distributed\nimport numpy as np\nfrom mlx_jupyter import distributed as dist\n"
                "print('sum', int(dist.all_sum(np.array([group.rank() + 1]), group=group)[0]))", timeout)
    assert res.status == "ok", (res.error or {}).get("evalue", res)
    assert re.search(rf"\[ranks 0-{n - 1}\] sum {n * (n + 1) // 2}", res.stdout), res.stdout


def alive(pids) -> list[int]:
    """Those of ``pids`` still running (zombies waiting for their parent count as gone)."""
    out = []
    for pid in pids:
        try:
            if psutil.Process(pid).status() != psutil.STATUS_ZOMBIE:
                out.append(pid)
        except psutil.Error:
            pass
    return out


def kill_leftovers(pids, grace: float = 3.0) -> list[int]:
    """Wait up to ``grace`` s for ``pids`` to end, then SIGKILL the rest; returns those that had to be killed."""
    procs = []
    for pid in alive(pids):
        try:
            procs.append(psutil.Process(pid))
        except psutil.Error:
            pass
    _, left = psutil.wait_procs(procs, timeout=grace)
    for proc in left:
        try:
            proc.kill()
        except psutil.Error:
            pass
    psutil.wait_procs(left, timeout=grace)
    return [p.pid for p in left]
