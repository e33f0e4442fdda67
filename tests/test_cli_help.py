"""`mlx-jupyter --version` and the commands' help: every option explained, examples shown."""

from __future__ import annotations

import importlib.metadata
import subprocess
import sys

import pytest

from mlx_jupyter.configurator import command as config_cli
from mlx_jupyter.launch import command as launch_cli

PARSERS = {"launch": launch_cli.build_parser, "config": config_cli.parser}
CLI = [sys.executable, "-m", "mlx_jupyter"]


def run(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(CLI + list(args), capture_output=True, text=True, timeout=60)


@pytest.mark.parametrize("flag", ["--version", "-V"])
def test_version(flag: str) -> None:
    p = run(flag)
    assert p.returncode == 0, p.stderr
    ours, mlx = importlib.metadata.version("mlx-jupyter"), importlib.metadata.version("mlx")
    assert p.stdout.strip() == f"mlx-jupyter {ours} (MLX {mlx})"


def test_usage_names_version_and_per_command_help() -> None:
    p = run("--help")
    assert p.returncode == 0 and "--version" in p.stdout and "COMMAND --help" in p.stdout


@pytest.mark.parametrize("command", ["launch", "config"])
def test_help_has_examples_and_every_option_is_explained(command: str) -> None:
    p = run(command, "--help")
    assert p.returncode == 0, p.stderr
    examples = p.stdout.split("\nexamples:\n", 1)[1]
    lines = [x.strip() for x in examples.splitlines() if x.strip().startswith("mlx-jupyter ")]
    assert len(lines) >= 3 and any(x.startswith(f"mlx-jupyter {command} ") for x in lines), examples
    silent = [a.option_strings for a in PARSERS[command]()._actions if a.option_strings and not a.help]
    assert silent == [], f"options without help text: {silent}"
