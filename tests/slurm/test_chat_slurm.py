"""The seed's headline job under Slurm (issue 43 §1): ``mlx-jupyter launch --slurm -- python -m mlx_lm chat``
on two nodes of the bed, tensor parallel. Its prompt (``› ``, no newline) shows before anything is typed:
slurmstepd alone held it until a newline that only comes after the user's answer."""

from __future__ import annotations

import pytest

from needs import require_module

require_module("mlx_lm", "MLX-LM (pip install -e '.[test]')")

from launch_helpers import PY, LiveCLI  # noqa: E402
from mlx_jupyter.models.tiny import write_tiny_model  # noqa: E402
from test_launch import env_of  # noqa: E402

pytestmark = pytest.mark.timeout(150)


def test_mlx_lm_chat_prompts_before_the_answer_and_replies(slurm, tmp_path_factory):
    folder = tmp_path_factory.mktemp("model")
    folder.chmod(0o755)
    write_tiny_model(folder)
    run = LiveCLI(["--slurm", "--nodes", "2", PY, "-m", "mlx_lm", "chat", "--model", str(folder), "--max-tokens", "8"],
                  env=env_of(slurm), stdin=True)
    try:
        run.wait_until(lambda out: "[rank 0] " in out and "›" in out.rsplit("\n", 1)[-1], stream="stdout", timeout=90)
        run.write("Hello\n")
        run.wait_until(lambda out: out.count("›") >= 2, stream="stdout", timeout=60)   # replied, asks again
        run.write("q\n", close=True)
        assert run.finish(60) == 0, run.text
        assert "bye" in run.text, run.text
    finally:
        if run.proc.poll() is None:
            run.proc.kill()
