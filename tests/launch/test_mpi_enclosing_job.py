"""``--backend mpi`` started from inside an MPI singleton or job: mpirun never sees the enclosing job.

MLX's ``mx.distributed.init()`` with no launcher initialises MPI in-process (a singleton), which
puts ``OMPI_MCA_ess=singleton`` and ``PMIX_*`` in the environment its children inherit. Open MPI's
mpirun started with those exits 1 and prints nothing (seen in CI: a test process had called it).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import textwrap

from hypothesis import given
from hypothesis import strategies as st

from launch_helpers import PY, cli_env
from mlx_jupyter.launch.mpi import ENCLOSING_JOB_PREFIXES, ENCLOSING_JOB_VARS, outside_enclosing_job
from needs import require

#: exactly what MLX's init() left in a child's environment here (Open MPI 4.1.4, PMIx 4.2.2)
SINGLETON = {
    "OMPI_MCA_pmix": "^s1,s2,cray,isolated", "OMPI_MCA_ess": "singleton", "PMIX_RANK": "0",
    "PMIX_NAMESPACE": "941621249", "PMIX_SERVER_URI2": "941621248.0;tcp4://127.0.0.1:58725",
    "OMPI_APP_CTX_NUM_PROCS": "1", "ORTE_SCHIZO_DETECTION": "ORTE", "OMPI_MCA_orte_ess_num_procs": "1",
    "OMPI_MCA_orte_launch": "1", "OMPI_MCA_orte_precondition_transports": "f49861d31c1c0f93-7f5ffa979c4a3b5e",
}
#: what a user sets on purpose, which must reach mpirun
USER = {"OMPI_MCA_btl": "tcp,self", "OMPI_ALLOW_RUN_AS_ROOT": "1", "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM": "1",
        "OMPI_MCA_btl_tcp_if_include": "lo", "PATH": "/usr/bin", "MLX_RANK": "3", "PMIX": "x", "ORTE": "y"}


def test_a_singletons_variables_go_and_the_users_settings_stay() -> None:
    assert outside_enclosing_job({**SINGLETON, **USER}) == USER


@given(st.dictionaries(st.text(min_size=1, max_size=24), st.text(max_size=8), max_size=12))
def test_only_enclosing_job_variables_are_dropped(env: dict[str, str]) -> None:
    kept = outside_enclosing_job(env)
    for key, value in env.items():
        enclosing = key in ENCLOSING_JOB_VARS or key.startswith(ENCLOSING_JOB_PREFIXES)
        assert (key in kept) is not enclosing and (enclosing or kept[key] == value)


def test_launch_mpi_from_a_process_that_called_mlx_init(tmp_path) -> None:
    """A real singleton (MLX's init in the parent) and a real mpirun: the ranks run."""
    require("Open MPI's mpirun", None if shutil.which("mpirun") else "mpirun not on PATH (apt-get install openmpi-bin)")
    marker = tmp_path / "ran"
    rank_code = f"open({str(marker)!r}, 'a').write('x')"
    parent = textwrap.dedent(f"""
        import subprocess, sys
        import mlx.core as mx
        mx.distributed.init()   # no launcher: MLX initialises MPI in this process
        seen = subprocess.run(["env"], capture_output=True, text=True).stdout
        assert "OMPI_MCA_ess=singleton" in seen, "MLX's init made no MPI singleton here"
        done = subprocess.run([{PY!r}, "-m", "mlx_jupyter", "launch", "--backend", "mpi", "-n", "2",
                               "--env=OMPI_ALLOW_RUN_AS_ROOT=1", "--env=OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1",
                               {PY!r}, "-c", {rank_code!r}], capture_output=True, text=True, timeout=60)
        sys.stdout.write(f"exit {{done.returncode}}\\n{{done.stdout}}{{done.stderr}}")
    """)
    env = {k: v for k, v in cli_env().items() if not k.startswith(("OMPI_", "PMIX_", "MLX_"))}
    done = subprocess.run([sys.executable, "-c", parent], capture_output=True, text=True, timeout=90, env=env,
                          cwd=tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr
    assert done.stdout.startswith("exit 0"), done.stdout
    assert marker.read_text() == "xx"
    assert os.path.exists(marker)
