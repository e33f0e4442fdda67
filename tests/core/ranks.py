"""Runs Python code as n local ring ranks (MLX's environment contract), for the core's tests."""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import subprocess
import sys
import tempfile
from dataclasses import dataclass, field

from mlx_jupyter.vocab.ports import free_port_block

PRELUDE = """
import json, os, sys, time, threading, signal
import numpy as np
from mlx_jupyter import distributed as dist
RANK = int(os.environ["MLX_RANK"])
# Ctrl-C as in a terminal, even when the test run itself was started in the background
# (a shell without job control starts it with SIGINT ignored, and children inherit that)
signal.signal(signal.SIGINT, signal.default_int_handler)
def report(**kw):
    print("RESULT " + json.dumps(kw), flush=True)
"""


@dataclass
class Ranks:
    """n rank processes sharing one hostfile and a token of their own; waits are bounded."""

    n: int
    code: str
    # Its own token: a rank of another scenario that ends up on this job's port is refused
    # (as another user's job would be), never taken for one of ours.
    token: str = field(default_factory=lambda: "test-" + secrets.token_hex(8))
    env: dict[str, str] = field(default_factory=dict)
    per_rank_env: dict[int, dict[str, str]] = field(default_factory=dict)
    tmp: str = ""
    procs: list[subprocess.Popen] = field(default_factory=list)
    hostfile: str = ""
    ports: list[int] = field(default_factory=list)

    def start(self, only: list[int] | None = None) -> "Ranks":
        if not self.tmp:
            self.tmp = tempfile.mkdtemp(prefix="mlxj-test-")
            base = free_port_block(self.n)
            self.ports = list(range(base, base + self.n))
            self.hostfile = os.path.join(self.tmp, "hostfile.json")
            with open(self.hostfile, "w") as fh:
                json.dump([[f"127.0.0.1:{p}"] for p in self.ports], fh)
            self.procs = [None] * self.n  # type: ignore[list-item]
        base = {**os.environ, "MLX_HOSTFILE": self.hostfile, "MLX_JUPYTER_TOKEN": self.token, **self.env}
        base.pop("MLX_JUPYTER_TIMEOUT", None)
        for r in only if only is not None else range(self.n):
            env = {**base, "MLX_RANK": str(r), **self.per_rank_env.get(r, {})}
            self.procs[r] = subprocess.Popen(
                [sys.executable, "-c", PRELUDE + self.code], env=env, cwd=self.tmp, text=True,
                stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        return self

    def finish(self, timeout: float = 60) -> list[tuple[int, str, str]]:
        out = []
        for p in self.procs:
            try:
                o, e = p.communicate(timeout=timeout)
            except subprocess.TimeoutExpired:
                self.kill()
                o, e = p.communicate()
                raise AssertionError(f"rank did not finish within {timeout} s:\n{o}\n{e}")
            out.append((p.returncode, o, e))
        return out

    def results(self, timeout: float = 60) -> list[dict]:
        res = []
        finished = self.finish(timeout)
        # every rank's story, not the first failure's only: the cause is often another rank
        failed = [f"rank {r} exited {code}\nstdout:\n{o[-3000:]}\nstderr:\n{e[-3000:]}"
                  for r, (code, o, e) in enumerate(finished) if code != 0]
        assert not failed, "\n".join(failed)
        for r, (code, o, e) in enumerate(finished):
            lines = [ln for ln in o.splitlines() if ln.startswith("RESULT ")]
            assert lines, f"rank {r} reported nothing\nstdout:\n{o}\nstderr:\n{e}"
            res.append(json.loads(lines[-1][7:]))
        return res

    def kill(self) -> None:
        for p in self.procs:
            if p and p.poll() is None:
                p.kill()

    def __enter__(self) -> "Ranks":
        return self

    def __exit__(self, *exc: object) -> None:
        self.kill()
        for p in self.procs:
            if p:
                p.wait(timeout=10)
        if self.tmp:
            import shutil

            shutil.rmtree(self.tmp, ignore_errors=True)


def run(n: int, code: str, timeout: float = 90, **kw) -> list[dict]:
    with Ranks(n, code, **kw) as ranks:
        return ranks.start().results(timeout)


def selected_cases(request, test_name: str, *params: str) -> list[tuple]:
    """The parameter tuples of `test_name`'s selected cases in the requesting module (after -k/-m/--deselect)."""
    return sorted({tuple(item.callspec.params[p] for p in params) for item in request.session.items
                   if item.module is request.module and item.originalname == test_name})


def results_side_by_side(cases: dict, timeout: float) -> dict:
    """Starts the cases' Ranks at once, then gives each case's results, or the AssertionError saying why its
    ranks failed (that case's test raises it; the others still judge theirs). MLXJ_TEST_SIDE_BY_SIDE=N
    runs N at a time (.ci/sanitizers: 1, as instrumented ranks are many times slower)."""
    at_once = int(os.environ.get("MLXJ_TEST_SIDE_BY_SIDE") or 0) or max(len(cases), 1)
    keys = list(cases)
    got: dict = {}
    for i in range(0, len(keys), at_once):
        batch = keys[i:i + at_once]
        with contextlib.ExitStack() as stack:
            for key in batch:
                stack.enter_context(cases[key]).start()
            for key in batch:
                try:
                    got[key] = cases[key].results(timeout)
                except AssertionError as exc:
                    got[key] = exc
    return got
