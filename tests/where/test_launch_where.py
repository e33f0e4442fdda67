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

import pytest
from hypothesis import given
from hypothesis import strategies as st

from mlx_jupyter.where import boot
from tests.launch.launch_helpers import PY, ROOT, LiveCLI

pytestmark = pytest.mark.timeout(60)

# The ranks that a table must show waiting are held 3 s: it matches within 0.1 s of "ready" here (and
# LiveCLI.where_showing asks again 0.3 s later when not), which leaves seconds of slack on a loaded machine.
SCRIPT = textwrap.dedent("""\
    import time, mlx.core as mx
    world = mx.distributed.init(backend=BACKEND, strict=True)
    print("ready", flush=True)
    if world.rank() == 1:
        time.sleep(3)
    mx.eval(mx.distributed.all_sum(mx.ones(3), group=world))
""")


#: Open MPI refuses root unless told (the tests run as root)
MPI_ENV = {"OMPI_ALLOW_RUN_AS_ROOT": "1", "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM": "1"}


@pytest.mark.parametrize("backend", ["ring", pytest.param("mpi", marks=pytest.mark.skipif(
    shutil.which("mpirun") is None, reason="needs Open MPI's mpirun"))])
def test_sigusr1_names_each_ranks_line(tmp_path, backend):
    script = tmp_path / "hang.py"
    script.write_text(SCRIPT.replace("BACKEND", repr(backend)))
    with LiveCLI(["-n", "2", "--backend", backend, "--where-on-signal", "--", "python", str(script)],
                 env=MPI_ENV) as job:
        job.wait_until(lambda t: t.count("ready") == 2, stream="stdout", timeout=30)
        job.where_showing([r"^0\s+waits in MLX all_sum #1 \(float32\[3\], built at line 6, evaluated at line 6\) "
                           r"on rank 1",
                           r"^1\s+has called 0 MLX collectives and is at line 5: time\.sleep\(3\)"], ranks=2)
        assert job.finish(20) == 0, job.text


def test_boot_wraps_python_scripts_modules_and_c_commands_keeping_options():
    b = boot.BOOT
    assert boot.wrap(["/usr/bin/python3", "t.py", "--x"]) == ["/usr/bin/python3", "-c", b, "t.py", "--x"]
    assert boot.wrap(["python", "-m", "pkg.mod", "a"]) == ["python", "-c", b, "-m", "pkg.mod", "a"]
    assert boot.wrap(["python3", "-c", "print(1)", "a"]) == ["python3", "-c", b, "-c", "print(1)", "a"]
    assert (boot.wrap(["python3", "-u", "-X", "dev", "-Wignore", "-OB", "t.py"])
            == ["python3", "-u", "-X", "dev", "-Wignore", "-OB", "-c", b, "t.py"])
    for left in (["./run.sh", "a"], ["python3"], ["python3", "-"], ["python3", "--", "t.py"], ["python3", "-u"],
                 ["python3", "-m"], ["python3", "-X"], ["python3", "--help"], ["python3", "-Z", "t.py"]):
        assert boot.wrap(left) is None, left


_OPTIONS = st.lists(st.sampled_from([["-u"], ["-B"], ["-OO"], ["-uB"], ["-X", "dev"], ["-Xutf8"], ["-W", "ignore"],
                                     ["-Wdefault"], ["-s"], ["-q"]]), max_size=4)


@given(_OPTIONS, st.sampled_from([["t.py"], ["-m", "pkg.mod"], ["-c", "x = 1"]]),
       st.lists(st.text(min_size=0, max_size=5), max_size=3))
def test_wrapping_keeps_the_options_in_front_and_the_rest_as_given(options, target, args):
    argv = ["python3", *sum(options, []), *target, *args]
    assert boot.wrap(argv) == ["python3", *sum(options, []), "-c", boot.BOOT, *target, *args]


PROBE = "import sys; print(sys.argv, __name__, sys.flags.optimize, sys.flags.dont_write_bytecode)"


@pytest.mark.parametrize("target", [["probe.py"], ["-m", "probe"], ["-c", PROBE]])
def test_a_wrapped_command_sees_what_it_would_see_unwrapped(tmp_path, target):
    (tmp_path / "probe.py").write_text(PROBE + "\n")
    argv = [PY, "-OB", *target, "a", "-b"]
    plain = subprocess.run(argv, capture_output=True, text=True, timeout=20, cwd=tmp_path)
    booted = subprocess.run(boot.wrap(argv), capture_output=True, text=True, timeout=20, cwd=tmp_path,
                            env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert plain.returncode == booted.returncode == 0, booted.stderr
    assert booted.stdout == plain.stdout


def test_where_shows_the_line_of_a_python_u_script_and_of_a_c_command(tmp_path):
    script = tmp_path / "wait.py"
    script.write_text("import time\nprint('ready', flush=True)\ntime.sleep(30)\n")
    for command in (["python", "-u", str(script)], ["python", "-c", script.read_text()]):
        with LiveCLI(["-n", "2", "--where-on-signal", "--", *command]) as job:
            job.wait_until(lambda t: t.count("ready") == 2, stream="stdout", timeout=30)
            job.where_showing([r"^0\s+running line 3: time\.sleep\(30\)", r"^1\s+running line 3: time\.sleep\(30\)"],
                              ranks=2)
            assert "does not run a Python script" not in job.text, job.text
            job.proc.send_signal(signal.SIGTERM)
            job.finish(20)


def test_a_python_without_mlx_jupyter_falls_back_to_faulthandler(tmp_path):
    script = tmp_path / "s.py"
    script.write_text("import os, signal, sys\nprint(sys.argv[1:], __name__)\nos.kill(os.getpid(), signal.SIGUSR1)\n"
                      "print('after')\n")
    env = {**os.environ, "PYTHONPATH": ""}
    out = subprocess.run([PY, "-I", "-S", "-c", boot.BOOT, str(script), "a"], capture_output=True,
                         text=True, timeout=20, env=env)
    assert out.returncode == 0, out.stderr
    assert out.stdout.splitlines() == ["['a'] __main__", "after"], out
    assert "Current thread" in out.stderr and f'File "{script}", line 3' in out.stderr, out.stderr  # the dump of where it was


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
    with LiveCLI(["-n", "2", "--where-on-signal", "--stdin-rank", "1", "--", "python", str(script)],
                 stdin=True) as job:
        job.wait_until(lambda t: "(Pdb)" in t, stream="stdout", timeout=30)
        job.where_showing([r"^1\s+in pdb \(line 6\)",
                            r"^0\s+in mx\.distributed\.all_sum at line 6 waiting on rank 1 \(in pdb\); no timeout "
                            r"\(MLX's collectives have none"], ranks=2)
        job.write("c\n", close=True)
        assert job.finish(20) == 0, job.text


def test_a_rank_that_is_not_python_is_never_signalled():
    """--where-on-signal with a shell command: SIGUSR1 (which would end it) is not sent; the table says why."""
    with LiveCLI(["-n", "2", "--where-on-signal", "--", "sh", "-c", "echo ready; read line; echo done"],
                 stdin=True) as job:
        job.wait_until(lambda t: t.count("ready") == 2, stream="stdout", timeout=20)
        table = job.where_showing([r"not started to answer(.|\n)*not started to answer"], ranks=2)
        assert table.count("not started to answer") == 2, table
        job.write("go\ngo\n", close=True)
        assert job.finish(20) == 0, job.text
        assert "\n".join(job.streams["stdout"]).count("done") == 2, job.text


def test_a_local_rank_survives_a_where_signal_before_its_boot_code(tmp_path):
    """A local rank starts with SIGUSR1 blocked: one that comes before the boot code waits for it (here: sent
    by the rank to itself from sitecustomize) stays pending, is answered, and ends nothing."""
    (tmp_path / "sitecustomize.py").write_text("import os, signal\nif 'MLX_RANK' in os.environ:\n"
                                               "    os.kill(os.getpid(), signal.SIGUSR1)  # a rank, not the launcher\n")
    script = tmp_path / "s.py"
    script.write_text("print('alive', flush=True)\n")
    with LiveCLI(["-n", "2", "--where-on-signal", "--", "python", str(script)],
                 env={"PYTHONPATH": f"{tmp_path}{os.pathsep}{ROOT}"}) as job:
        assert job.finish(30) == 0, job.text
        assert "\n".join(job.streams["stdout"]).count("alive") == 2, job.text


FOUR = textwrap.dedent("""\
    import time, mlx.core as mx, mlx.nn as nn
    world = mx.distributed.init(backend="ring", strict=True)
    print("ready", flush=True)
    r = world.rank()
    if r == 3:
        time.sleep(3)
    g = nn.average_gradients({"w": mx.ones((2, 3))})
    mx.eval(g)
""")


def test_sigusr1_names_an_mlx_wait_inside_mlx_nn_on_four_ranks(tmp_path):
    """Ranks 0-2 wait in an all_sum built inside mlx.nn on rank 3, which has called none."""
    script = tmp_path / "four.py"
    script.write_text(FOUR)
    with LiveCLI(["-n", "4", "--backend", "ring", "--where-on-signal", "--", "python", str(script)]) as job:
        job.wait_until(lambda t: t.count("ready") == 4, stream="stdout", timeout=40)
        job.where_showing([
            r"^0\s+waits in MLX all_sum #1 \(float32\[6\], built at line 7 through nn\.utils\.average_gradients, "
            r"evaluated at line 8\) on rank 3",
            r"^1\s+waits in MLX all_sum #1 .* on rank 3", r"^2\s+waits in MLX all_sum #1 .* on rank 3",
            r"^3\s+has called 0 MLX collectives and is at line 6: time\.sleep\(3\)"], ranks=4, timeout=20)
        assert job.finish(30) == 0, job.text


MISMATCH = textwrap.dedent("""\
    import time, mlx.core as mx
    world = mx.distributed.init(backend="ring", strict=True)
    print("ready", flush=True)
    if world.rank() == 0: y = mx.distributed.all_sum(mx.ones(4), group=world)
    else: y = mx.distributed.all_gather(mx.ones(8), group=world)
    mx.eval(y)
    time.sleep(3)  # the rank that got through stays, the other hangs
""")


def test_sigusr1_names_an_mlx_mismatch(tmp_path):
    """MLX's ring lets one rank through an all_sum of float32[4] against the other's all_gather of float32[8]; the
    other hangs until it ends. The table names the two calls, and each rank's row where it is: the one let
    through is not in its call any more (it sleeps at line 7)."""
    script = tmp_path / "mismatch.py"
    script.write_text(MISMATCH)
    with LiveCLI(["-n", "2", "--backend", "ring", "--where-on-signal", "--", "python", str(script)]) as job:
        job.wait_until(lambda t: t.count("ready") == 2, stream="stdout", timeout=30)
        theirs = {0: r"rank 1's all_gather #1 \(float32\[8\], built at line 5\)",
                  1: r"rank 0's all_sum #1 \(float32\[4\], built at line 4\)"}
        mine = {0: r"all_sum #1 \(float32\[4\], built at line 4", 1: r"all_gather #1 \(float32\[8\], built at line 5"}
        rows = [rf"^{r}\s+(?:in MLX {mine[r]}, evaluated at line 6\), which does not match {theirs[r]}"
                rf"|has called MLX {mine[r]}\), which does not match {theirs[r]}, and is at line 7: time\.sleep\(3\))"
                for r in (0, 1)]
        job.where_showing([*rows,
                           r"^MLX collectives do not match: rank 0's all_sum #1 of float32\[4\] \(built at line 4\) "
                           r"and rank 1's all_gather #1 of float32\[8\] \(built at line 5\)"], ranks=2)
        job.finish(30)


SPLIT = textwrap.dedent("""\
    import time, mlx.core as mx
    world = mx.distributed.init(backend="mpi", strict=True)
    half = world.split(0)
    print("ready", flush=True)
    if world.rank() == 1:
        time.sleep(3)
    mx.eval(mx.distributed.all_sum(mx.ones(2), group=half))
""")


@pytest.mark.skipif(shutil.which("mpirun") is None, reason="needs Open MPI's mpirun (MLX's ring cannot split)")
def test_sigusr1_names_an_mlx_wait_on_a_split(tmp_path):
    script = tmp_path / "split.py"
    script.write_text(SPLIT)
    with LiveCLI(["-n", "2", "--backend", "mpi", "--where-on-signal", "--", "python", str(script)], env=MPI_ENV) as job:
        job.wait_until(lambda t: t.count("ready") == 2, stream="stdout", timeout=30)
        job.where_showing([r"^0\s+waits in MLX all_sum #1 \(float32\[2\], built at line 7, evaluated at line 7\) "
                           r"on rank 1",
                           r"^1\s+has called 0 MLX collectives on group world/0 and is at line 6: time\.sleep\(3\)"],
                          ranks=2)
        job.finish(30)   # (MLX frees the split's communicator after MPI_Finalize: the exit code is MLX's)
