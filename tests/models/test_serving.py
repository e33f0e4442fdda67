"""``mlx-jupyter launch -n 2 -- python -m mlx_lm server``: rank 0 answers an OpenAI-style chat
request with the model sharded over both ranks, and the launch stops on Ctrl-C."""

from __future__ import annotations

import json
import signal
import socket
import urllib.request

import psutil
import pytest

from needs import require_module

require_module("mlx_lm", "MLX-LM (pip install -e '.[test]')")

from launch_helpers import LiveCLI  # noqa: E402
from mlx_jupyter.models.tiny import write_tiny_model  # noqa: E402

pytestmark = pytest.mark.timeout(150)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_rank_0_serves_a_chat_completion_of_the_sharded_model(tmp_path):
    import mlx_lm

    folder = write_tiny_model(tmp_path / "tiny", seed=5)
    model, tokenizer = mlx_lm.load(str(folder))
    messages = [{"role": "user", "content": "Hello, who are you?"}]
    prompt = tokenizer.apply_chat_template(messages, add_generation_prompt=True)
    expected = mlx_lm.generate(model, tokenizer, prompt, max_tokens=12)

    port = _free_port()
    with LiveCLI(["-n", "2", "--", "python", "-m", "mlx_lm", "server", "--model", str(folder),
                  "--port", str(port)]) as live:
        live.wait_for(r"^\[rank 0\] .*Starting httpd at 127\.0\.0\.1 on port " + str(port), timeout=90)
        body = json.dumps({"messages": messages, "max_tokens": 12, "temperature": 0.0}).encode()
        request = urllib.request.Request(f"http://127.0.0.1:{port}/v1/chat/completions", data=body,
                                         headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(request, timeout=60) as answer:
            reply = json.loads(answer.read())
        assert reply["choices"][0]["message"]["content"] == expected
        assert reply["usage"]["completion_tokens"] == 12 and reply["usage"]["prompt_tokens"] == len(prompt)
        ranks = [p for p in psutil.Process(live.proc.pid).children(recursive=True) if str(folder) in p.cmdline()]
        assert len(ranks) == 2
        live.proc.send_signal(signal.SIGINT)
        live.finish(30)
    assert psutil.wait_procs(ranks, timeout=10)[1] == [], "a rank outlived the stopped launch"
    assert not [line for line in live.lines if line.startswith("[rank 1]") and "Starting httpd" in line]
