"""One spec for every cluster option (issue 34 §1): each declared once, and every surface agrees with it.

Pure: the package's source is read with ``ast``; the parsers are built, not run.
"""

from __future__ import annotations

import argparse
import ast
import inspect
import re
from pathlib import Path

import pytest

from mlx_jupyter.vocab import options
from mlx_jupyter.vocab import backends
from mlx_jupyter.cluster.cluster import Cluster
from mlx_jupyter.cluster.engineset import MLXEngineSetLauncher
from mlx_jupyter.configurator import command as config_cli
from mlx_jupyter.vocab import binding
from mlx_jupyter.launch import command as launch_cli
from mlx_jupyter.launch.launch_config import LaunchConfig
from mlx_jupyter.launch.launcher import Launcher
from mlx_jupyter.magic_help import CLUSTER_ACTIONS, cluster_action_help
from mlx_jupyter.magics import MLXMagics
from mlx_jupyter.server import requests

PACKAGE = Path(options.__file__).resolve().parent
SPEC_FILE = Path(options.__file__).resolve()
#: the modules that parse each surface's command line (other commands may have flags of the same name that mean
#: something else: the configurator's --hosts, the demo's -n)
PARSERS = {"magics.py": options.START, "launch/command.py": options.LAUNCH, "launch/slurm/command.py": options.LAUNCH,
           "configurator/command.py": options.CONFIG, "net/ssh.py": options.LAUNCH}
#: a flag another option of the same name has: %%mlx_distributed's own --timeout (a cell's, not the ranks' start)
SAME_FLAG_ELSEWHERE = {("magics.py", "--timeout")}
#: parameters named like an option that every wait has, each with its own default (push, pull, copies)
GENERIC = {"timeout"}


def modules() -> dict[str, ast.AST]:
    return {str(p.relative_to(PACKAGE)): ast.parse(p.read_text(), str(p)) for p in sorted(PACKAGE.rglob("*.py"))
            if p.resolve() != SPEC_FILE}


def declared_flags(tree: ast.AST) -> set[str]:
    """The flags given to an ``add_argument``/``argument`` call in ``tree``."""
    out = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and getattr(node.func, "attr", getattr(node.func, "id", "")) in (
                "add_argument", "argument"):
            out.update(a.value for a in node.args if isinstance(a, ast.Constant) and isinstance(a.value, str))
    return out


def literal_defaults(tree: ast.AST) -> list[tuple[str, object]]:
    """(name, default) of every parameter and class field in ``tree`` whose default is a literal."""
    out = []
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            args = node.args.args + node.args.kwonlyargs
            defaults = [None] * (len(node.args.args) - len(node.args.defaults)) + node.args.defaults + node.args.kw_defaults
            out += [(a.arg, d.value) for a, d in zip(args, defaults) if isinstance(d, ast.Constant)]
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name) and isinstance(node.value, ast.Constant):
            out.append((node.target.id, node.value.value))
    return out


def strings(tree: ast.AST) -> list[str]:
    return [n.value for n in ast.walk(tree) if isinstance(n, ast.Constant) and isinstance(n.value, str)]


def words(text: str) -> str:
    return " ".join(text.split())


def test_each_option_is_declared_once_in_the_package() -> None:
    """Its flags, its default and its help are written in mlx_jupyter/vocab/options.py and nowhere else."""
    trees = modules()
    wrong = []
    for name, tree in trees.items():
        flags, defaults, texts = declared_flags(tree), literal_defaults(tree), strings(tree)
        for o in options.SPEC:
            if PARSERS.get(name) in o.surfaces:
                wrong += [f"{name} declares {f}" for f in o.flags if f in flags and (name, f) not in SAME_FLAG_ELSEWHERE]
            if o.default not in (None, (), False) and o.dest not in GENERIC:
                wrong += [f"{name} writes {o.dest}'s default {d!r} again" for n, d in defaults
                          if n in (o.dest, o.keyword) and d == o.default]
            head = words(o.help)[:40]
            wrong += [f"{name} writes {o.flags[-1]}'s help again" for t in texts if head in words(t)]
    assert wrong == []


def test_the_spec_names_each_option_once() -> None:
    dests = [o.dest for o in options.SPEC]
    flags = [f for o in options.SPEC for f in o.flags]
    assert len(set(dests)) == len(dests) and len(set(flags)) == len(flags)
    assert all(o.help and o.surfaces for o in options.SPEC)


def test_bind_to_has_one_default_and_binding_has_the_policies() -> None:
    bind = options.option("bind_to")
    assert bind.choices is binding.POLICIES and bind.default in binding.POLICIES
    assert LaunchConfig(command=["x"]).bind_to == bind.default
    assert inspect.signature(Launcher).parameters["bind_to"].default == bind.default
    assert MLXEngineSetLauncher.bind_to.default_value == bind.default


@pytest.mark.parametrize("action", [a for a, (_, names) in CLUSTER_ACTIONS.items() if names])
def test_the_magics_help_lists_every_option_of_the_action(action: str) -> None:
    text = words(cluster_action_help(MLXMagics.mlx_cluster, action))
    for o in options.on(action):
        assert o.flags[0] in text and words(o.help.replace("%%", "%"))[:30] in text, (action, o.flags)


def test_help_start_has_the_slurm_options_and_help_restart_has_clean() -> None:
    start = cluster_action_help(MLXMagics.mlx_cluster, "start")
    for flag in ("--slurm", "--nodes", "--partition", "--time", "--account", "--slurm-arg", "--keep-allocation"):
        assert flag in start, flag
    assert "--clean" in cluster_action_help(MLXMagics.mlx_cluster, "restart")
    assert "--clean" not in start


def _actions(parser: argparse.ArgumentParser) -> dict[str, argparse.Action]:
    return {a.option_strings[-1]: a for a in parser._actions if a.option_strings}


@pytest.mark.parametrize("surface, parser", [(options.LAUNCH, launch_cli.build_parser),
                                             (options.CONFIG, config_cli.parser),
                                             (options.START, lambda: MLXMagics.mlx_cluster.parser)])
def test_the_parsers_agree_with_the_spec(surface: str, parser) -> None:
    """Each option a surface offers is parsed there with the spec's flags, type, choices and help."""
    actions = _actions(parser())
    for o in options.on(surface):
        a = actions[o.flags[-1]]
        assert tuple(a.option_strings) == o.flags
        assert a.help.endswith(o.help), o.flags
        assert a.choices == (list(o.choices) if isinstance(a.choices, list) else o.choices)
        assert a.type is o.check
        if o.dest not in ("python", "connect_timeout"):   # the CLIs' own defaults: this interpreter, config's 5 s
            assert a.default == (list(o.default) if isinstance(o.default, tuple) else o.default), o.flags


def test_the_launch_help_shows_the_spec() -> None:
    text = words(launch_cli.build_parser().format_help())
    for o in options.on(options.LAUNCH):
        assert words(o.help.replace("%(default)g", "10"))[:40] in text, o.flags


def test_the_panel_schema_is_the_spec() -> None:
    panel = [o.keyword for o in options.on(options.PANEL)]
    assert list(requests.SCHEMA["properties"]) == panel == list(requests.FIELDS)
    assert [f["name"] for f in requests.form_fields()] == panel
    assert requests.SCHEMA["properties"]["backend"]["enum"][:-2] == list(backends.NAMES)


def test_cluster_takes_every_option_with_the_spec_defaults() -> None:
    params = inspect.signature(Cluster).parameters
    keywords = {o.keyword for o in options.SPEC if o.keyword is not None}
    assert set(params) == keywords | set(options.PYTHON_ONLY)
    for o in options.SPEC:
        if o.keyword is not None and o.action is None and o.default is not None:
            assert params[o.keyword].default == o.default, o.keyword


def test_connect_waits_as_long_as_the_connect_magic_by_default() -> None:
    from mlx_jupyter.cluster.connected import ConnectedCluster

    wait = options.option("timeout")
    assert options.CONNECT in wait.surfaces and wait.default == 60.0
    for connect in (Cluster.connect, ConnectedCluster.connect):
        assert inspect.signature(connect).parameters["timeout"].default == wait.default, connect


def test_a_parsed_start_becomes_the_cluster_arguments() -> None:
    args = MLXMagics.mlx_cluster.parser.parse_args(
        ["start", "-n", "3", "--bind-to", "none", "--slurm", "--nodes", "2", "--keep-allocation"])
    kw = options.cluster_kwargs(args)
    assert (kw["n"], kw["bind_to"], kw["scheduler"], kw["nodes"], kw["on_failure"]) == (3, "none", "slurm", 2, "keep")
    plain = options.cluster_kwargs(MLXMagics.mlx_cluster.parser.parse_args(["start"]))
    assert "scheduler" not in plain and plain["timeout"] == options.option("timeout").default
    assert re.search(r"only mean something|^$", " ".join(options.given_without(args, "start", "Slurm", "slurm"))) is not None
