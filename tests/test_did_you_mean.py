"""Typos get a "did you mean" (issue 30 §4 item 9): commands, flags and choices; py3.11's argparse has none."""

from __future__ import annotations

import io
import subprocess
import sys

import pytest

from mlx_jupyter import cli
from mlx_jupyter.configurator import command as config_cli
from mlx_jupyter.launch import command as launch_cli
from mlx_jupyter.suggest import ArgumentParser, closest


def test_a_mistyped_command_is_suggested():
    p = subprocess.run([sys.executable, "-m", "mlx_jupyter", "lauch"], capture_output=True, text=True, timeout=60)
    assert p.returncode == 2
    assert p.stderr.startswith("mlx-jupyter: unknown command 'lauch' (did you mean 'launch'?)"), p.stderr


def test_an_unrelated_word_gets_no_suggestion(capsys):
    assert cli.main(["frobnicate"]) == 2
    err = capsys.readouterr().err
    assert "unknown command 'frobnicate'" in err and "did you mean" not in err


@pytest.mark.parametrize("argv, hint", [
    (["--hots", "a,b", "--", "true"], "unrecognized arguments: --hots (did you mean --hosts for --hots?)"),
    (["--hots=a,b", "--bakend", "ring", "--", "true"], "(did you mean --hosts for --hots, --backend for --bakend?)"),
    (["--backend", "rign", "--", "true"], "invalid choice: 'rign' (choose from 'ring', 'jaccl', 'jaccl-ring', "
                                          "'nccl', 'mpi') (did you mean 'ring'?)"),
    (["--bind-to", "core", "--", "true"], "(did you mean 'cores'?)"),
])
def test_launch_flags_and_choices(argv, hint, capsys):
    with pytest.raises(SystemExit):
        launch_cli.main(argv)
    assert hint in capsys.readouterr().err


def test_config_suggests_even_when_a_required_flag_is_reported_first(capsys):
    """argparse reports the missing --hosts/--hostfile before the unknown --hots: the hint still comes."""
    assert config_cli.main(["--hots", "a,b"], out=io.StringIO()) == 2
    err = capsys.readouterr().err
    assert "one of the arguments --hosts --hostfile is required (did you mean --hosts for --hots?)" in err, err


def test_no_suggestion_for_an_unrelated_flag(capsys):
    with pytest.raises(SystemExit):
        launch_cli.main(["--zzzzzz", "--", "true"])
    assert "did you mean" not in capsys.readouterr().err


def test_parser_subclass_on_its_own(capsys):
    p = ArgumentParser(prog="x")
    p.add_argument("--verbose", action="store_true")
    with pytest.raises(SystemExit):
        p.parse_args(["--verbsoe"])
    assert "(did you mean --verbose for --verbsoe?)" in capsys.readouterr().err
    assert closest("lauch", ["demo", "doctor", "launch", "config"]) == "launch" and closest("zzz", ["launch"]) is None
