"""``mlx-jupyter launch --where-on-signal``: SIGUSR1 to the launcher prints where every rank is, for ranks the
launcher starts itself and for ranks mpirun starts (``--backend mpi``: mpirun passes SIGUSR1 on). Slurm's
step: tests/slurm/test_where_slurm.py."""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import sys
import textwrap
import threading

import pytest

from mlx_jupyter.where import boot

pytestmark = pytest.mark.timeout(60)

SCRIPT = textwrap.dedent("""\
    import time, mlx.core as mx
    world = mx.distributed.init(backend=BACKEND, strict=True)
    print("ready", flush=True)
    if world.rank() == 1:
        time.sleep(6)
    mx.eval(mx.distributed.all_sum(mx.ones(3), group=world))
""")


#: Open MPI refuses root unless told (the tests run as root)
MPI_ENV = {"OMPI_ALLOW_RUN_AS_ROOT": "1", "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM": "1"}


@pytest.mark.parametrize("backend", ["ring", pytest.param("mpi", marks=pytest.mark.skipif(
    shutil.which("mpirun") is None, reason="needs Open MPI's mpirun"))])
def test_sigusr1_names_each_ranks_line(tmp_path, backend):
    script = tmp_path / "hang.py"
    script.write_text(SCRIPT.replace("BACKEND", repr(backend)))
    proc = subprocess.Popen([sys.executable, "-m", "mlx_jupyter", "launch", "-n", "2", "--backend", backend,
                             "--where-on-signal", "--", "python", str(script)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env={**os.environ, **MPI_ENV})
    ready, err = [], []
    both = threading.Event()

    def read_out() -> None:
        for line in proc.stdout:
            if line.rstrip().endswith("ready"):
                ready.append(line)
                if len(ready) == 2:
                    both.set()

    threading.Thread(target=read_out, daemon=True).start()
    try:
        assert both.wait(30), "the ranks did not start"
        got_table = threading.Event()

        def read_err() -> None:
            for line in proc.stderr:
                err.append(line)
                if "\n".join(err).count("mx.") and "waiting on rank 1" in "".join(err):
                    got_table.set()

        threading.Thread(target=read_err, daemon=True).start()
        proc.send_signal(signal.SIGUSR1)
        assert got_table.wait(5), "".join(err)
        text = "".join(err)
        assert re.search(r"^0\s+in mx\.distributed\.all_sum at line 6 waiting on rank 1", text, re.M), text
        assert re.search(r"^1\s+running line 5: time\.sleep\(6\)", text, re.M), text
        assert proc.wait(20) == 0, "".join(err)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def test_boot_wraps_only_python_scripts_and_modules():
    assert boot.wrap(["/usr/bin/python3", "t.py", "--x"]) == ["/usr/bin/python3", "-c", boot.BOOT, "t.py", "--x"]
    assert boot.wrap(["python", "-m", "pkg.mod", "a"])[3:] == ["-m", "pkg.mod", "a"]
    assert boot.wrap(["./run.sh", "a"]) is None and boot.wrap(["python3", "-u", "t.py"]) is None


def test_a_python_without_mlx_jupyter_falls_back_to_faulthandler(tmp_path):
    script = tmp_path / "s.py"
    script.write_text("import os, signal, sys\nprint(sys.argv[1:], __name__)\nos.kill(os.getpid(), signal.SIGUSR1)\n"
                      "print('after')\n")
    env = {**os.environ, "PYTHONPATH": ""}
    out = subprocess.run([sys.executable, "-I", "-S", "-c", boot.BOOT, str(script), "a"], capture_output=True,
                         text=True, timeout=20, env=env)
    assert out.returncode == 0, out.stderr
    assert out.stdout.splitlines() == ["['a'] __main__", "after"], out
    assert "Current thread" in out.stderr or "Thread" in out.stderr, out.stderr


PDB_SCRIPT = textwrap.dedent("""\
    import mlx.core as mx
    world = mx.distributed.init(backend="ring", strict=True)
    print("ready", flush=True)
    if world.rank() == 1:
        breakpoint()
    mx.eval(mx.distributed.all_sum(mx.ones(3), group=world))
""")


def test_a_launched_rank_at_its_pdb_prompt_shows_as_in_pdb(tmp_path):
    """``--stdin-rank 1``: rank 1 sits at its pdb prompt (a plain pdb, the script's own), rank 0 waits in MLX's
    all_sum; SIGUSR1 says so, with MLX's lack of a timeout; then ``c`` from the launcher's stdin ends both."""
    script = tmp_path / "stop.py"
    script.write_text(PDB_SCRIPT)
    proc = subprocess.Popen([sys.executable, "-m", "mlx_jupyter", "launch", "-n", "2", "--where-on-signal",
                             "--stdin-rank", "1", "--", "python", str(script)], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    out, err = [], []
    prompt, table = threading.Event(), threading.Event()

    def read(stream, into, event, done) -> None:
        for line in stream:
            into.append(line)
            if done("".join(into)):
                event.set()

    threading.Thread(target=read, args=(proc.stdout, out, prompt, lambda t: "(Pdb)" in t), daemon=True).start()
    threading.Thread(target=read, args=(proc.stderr, err, table, lambda t: "rank 1 is in pdb" in t),
                     daemon=True).start()
    try:
        assert prompt.wait(30), "".join(out + err)
        proc.send_signal(signal.SIGUSR1)
        assert table.wait(10), "".join(err)
        text = "".join(err)
        assert re.search(r"^1\s+in pdb \(line 6\)", text, re.M), text
        assert re.search(r"^0\s+in mx\.distributed\.all_sum at line 6 waiting on rank 1 \(in pdb\); no timeout "
                         r"\(MLX's collectives have none", text, re.M), text
        proc.stdin.write("c\n")
        proc.stdin.close()
        assert proc.wait(20) == 0, "".join(out + err)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def test_a_rank_that_is_not_python_is_never_signalled():
    """--where-on-signal with a shell command: SIGUSR1 (which would end it) is not sent; the table says why."""
    proc = subprocess.Popen([sys.executable, "-m", "mlx_jupyter", "launch", "-n", "2", "--where-on-signal", "--",
                             "sh", "-c", "echo ready; read line; echo done"], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    out, err = [], []
    ready, table = threading.Event(), threading.Event()

    def read(stream, into, event, done) -> None:
        for line in stream:
            into.append(line)
            if done("".join(into)):
                event.set()

    threading.Thread(target=read, args=(proc.stdout, out, ready, lambda t: t.count("ready") == 2), daemon=True).start()
    threading.Thread(target=read, args=(proc.stderr, err, table, lambda t: "where the ranks are" in t and
                                        t.count("not started to answer") == 2), daemon=True).start()
    try:
        assert ready.wait(20), "".join(out + err)
        proc.send_signal(signal.SIGUSR1)
        assert table.wait(10), "".join(err)
        proc.stdin.write("go\ngo\n")
        proc.stdin.close()
        assert proc.wait(20) == 0, "".join(out + err)
        assert "".join(out).count("done") == 2, out
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
