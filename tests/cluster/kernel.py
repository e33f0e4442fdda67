"""A real IPython kernel driven through jupyter_client, for the cluster/magics tests."""

from __future__ import annotations

import queue
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Optional

import os
from jupyter_client.manager import KernelManager


@dataclass
class CellResult:
    """What one execute_request produced."""

    status: str = ""
    stdout: str = ""
    stderr: str = ""
    displays: list = field(default_factory=list)
    error: Optional[dict] = None
    elapsed: float = 0.0

    @property
    def traceback(self) -> str:
        import re

        tb = "\n".join(self.error["traceback"]) if self.error else ""
        return re.sub(r"\x1b\[[0-9;]*[A-Za-z]", "", tb)


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
            if kind == "stream":
                if content["name"] == "stdout":
                    res.stdout += content["text"]
                else:
                    res.stderr += content["text"]
                if on_output:
                    on_output(content["name"], content["text"])
            elif kind in ("display_data", "execute_result", "update_display_data"):
                res.displays.append(content)
            elif kind == "error":
                res.error = content
            elif kind == "status" and content["execution_state"] == "idle":
                break
        reply = self.kc.get_shell_msg(timeout=max(1.0, deadline - time.monotonic()))
        while reply["parent_header"].get("msg_id") != msg_id:
            reply = self.kc.get_shell_msg(timeout=max(1.0, deadline - time.monotonic()))
        res.status = reply["content"]["status"]
        res.elapsed = time.monotonic() - t0
        return res

    def run(self, code: str, timeout: float = 30) -> CellResult:
        return self.collect(self.submit(code), timeout)

    def interrupt(self) -> None:
        self.km.interrupt_kernel()

    def close(self) -> None:
        try:
            self.kc.stop_channels()
        finally:
            self.km.shutdown_kernel(now=False)
