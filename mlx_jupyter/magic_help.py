"""Help for the magics: ``%%mlx_distributed --help``, ``%mlx_cluster`` (its actions) and one action's options.

Pure: ``%mlx_cluster``'s options are the spec's (:mod:`mlx_jupyter.vocab.options`), made into the magic's
``@argument`` decorators here, and each action's help is read back from them, so the help can never
drift from what the parser accepts.
"""

from __future__ import annotations

import re
from typing import Any, Callable

from IPython.core.magic_arguments import MagicArgumentParser, argument

from mlx_jupyter.vocab import options


def _flags(action: str) -> tuple[str, ...]:
    return tuple(o.flags[0] for o in options.on(action))


#: ``%mlx_cluster`` actions: a one-line summary and the options (by flag or positional name) each takes
CLUSTER_ACTIONS: dict[str, tuple[str, tuple[str, ...]]] = {
    "start": ("start ranks for this kernel (local, on hosts over ssh, or under Slurm)", _flags(options.START)),
    "stop": ("stop this kernel's cluster (a connected one is only left: it keeps running)", ()),
    "restart": ("start this kernel's ranks again (same ranks and ids)", _flags(options.RESTART)),
    "status": ("a table of the ranks: host, pid, state, backend, memory", ()),
    "connect": ("use a cluster started elsewhere (the MLX Cluster panel lists them)",
                ("cluster_id",) + _flags(options.CONNECT)),
    "where": ("where each rank is now: its line, the op it is in and whom it waits on", ()),
    "help": ("this list, or one action's options: %mlx_cluster help ACTION", ()),
}


def cluster_arguments(func: Callable[..., Any]) -> Callable[..., Any]:
    """Decorate ``%mlx_cluster`` with every option of its actions, in the spec's order (each once)."""
    seen: dict[str, options.Option] = {}
    for action in CLUSTER_ACTIONS:
        for o in options.on(action):
            seen.setdefault(o.dest, o)
    for o in reversed(list(seen.values())):   # a decorator list runs bottom-up: the last added shows first
        func = argument(*o.flags, **o.argparse_kwargs(prefixed=True))(func)
    return func


def cluster_actions_text() -> str:
    """Every ``%mlx_cluster`` action with its one-line summary."""
    width = max(map(len, CLUSTER_ACTIONS))
    rows = [f"  {name.ljust(width)}  {summary}" for name, (summary, _) in CLUSTER_ACTIONS.items()]
    return ("usage: %mlx_cluster ACTION [options]\n\nactions:\n" + "\n".join(rows) +
            "\n\nOne action's options: %mlx_cluster help ACTION (or %mlx_cluster ACTION --help).")


def cluster_action_help(magic_func: Any, action: str) -> str:
    """The usage and options of one ``%mlx_cluster`` action, from ``magic_func``'s own arguments."""
    if action not in CLUSTER_ACTIONS:
        raise ValueError(f"no action {action!r}: the actions are {', '.join(CLUSTER_ACTIONS)}")
    summary, names = CLUSTER_ACTIONS[action]
    parser = MagicArgumentParser(prog=f"mlx_cluster {action}", description=summary)
    for deco in reversed(getattr(magic_func, "decorators", [])):
        if isinstance(deco, argument) and set(deco.args) & set(names):
            deco.add_to_parser(parser, None)
    return plain_help(parser.format_help())


def plain_help(text: str) -> str:
    """IPython's magic help without its reST ``::`` block marker: ``usage: %magic ...``."""
    return "usage: " + text[len("::\n\n  "):] if text.startswith("::\n\n  ") else text


#: ``%%mlx_distributed`` with ``-h``/``--help`` among its options (the rest of the line)
_DISTRIBUTED_HELP = re.compile(r"%%mlx_distributed\b(?=.*\s(?:-h|--help)(?:\s|$))")


def help_without_body(lines: list[str]) -> list[str]:
    """An input transformer: ``%%mlx_distributed --help`` alone in a cell gets an empty line as its body.

    IPython refuses a cell magic whose body is empty before the magic sees its options
    ("the cell body is empty"); with a body line the magic shows its help.
    """
    if len(lines) == 1 and _DISTRIBUTED_HELP.match(lines[0].rstrip() + " "):
        return [lines[0].rstrip("\n") + "\n", "\n"]
    return lines
