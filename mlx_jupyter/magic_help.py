"""Help for the magics: ``%%mlx_distributed --help``, ``%mlx_cluster`` (its actions) and one action's options.

Pure: the options come from the magics' own ``@argument`` decorators (IPython's magic_arguments),
so the help can never drift from what the parser accepts.
"""

from __future__ import annotations

import re
from typing import Any

from IPython.core.magic_arguments import MagicArgumentParser, argument

#: ``%mlx_cluster`` actions: a one-line summary and the options (by flag or positional name) each takes
CLUSTER_ACTIONS: dict[str, tuple[str, tuple[str, ...]]] = {
    "start": ("start ranks for this kernel (local, or on hosts over ssh)",
              ("-n", "--hosts", "--hostfile", "--backend", "--python", "--env", "--cwd", "--timeout",
               "--controller-ip", "--accept-unknown-hosts", "--ssh-config", "--known-hosts", "-i",
               "--connect-timeout", "--bind-to", "--record-state")),
    "stop": ("stop this kernel's cluster (a connected one is only left: it keeps running)", ()),
    "restart": ("start this kernel's ranks again (same ranks and ids)", ("--timeout",)),
    "status": ("a table of the ranks: host, pid, state, backend, memory", ()),
    "connect": ("use a cluster started elsewhere (the MLX Cluster panel lists them)", ("cluster_id", "--timeout")),
    "where": ("where each rank is now: its line, the op it is in and whom it waits on", ()),
    "help": ("this list, or one action's options: %mlx_cluster help ACTION", ()),
}

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
