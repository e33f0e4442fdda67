"""Every option of a cluster start, declared once: flags, type, default, check, help and where it is offered.

Pure data (:data:`SPEC`). The magics' parser and per-action help (``magic_help.py``), the flags of
``mlx-jupyter launch`` that coincide, the ssh flags of every command (``net/ssh.py``), the panel's
request schema (``server/requests.py``) and the check of ``Cluster(...)``'s signature
(``tests/test_options.py``) come from here. How to add one: docs/architecture.md.
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass
from typing import Any, Callable, Iterator, Optional

from mlx_jupyter.vocab import limits
from mlx_jupyter.vocab import backends
from mlx_jupyter.vocab.binding import POLICIES

# Where an option is offered: the %mlx_cluster actions, the launcher's and the configurator's command
# lines, the panel's start request. ``Cluster()`` has every option with a ``keyword``.
START, RESTART, CONNECT = "start", "restart", "connect"
LAUNCH, CONFIG, PANEL = "launch", "config", "panel"


@dataclass(frozen=True)
class Option:
    """One option; ``dest`` is its name in a parsed command line, ``keyword`` its name in ``Cluster()``."""

    flags: tuple[str, ...]
    help: str
    surfaces: frozenset[str]
    keyword: Optional[str] = None   # Cluster()'s parameter and the panel's field (None: neither has it)
    default: Any = None
    check: Optional[Callable[[str], Any]] = None   # text -> value, refusing a bad one (limits.arg_type)
    choices: Optional[tuple[str, ...]] = None
    action: Optional[str] = None   # "store_true" or "append"
    metavar: Optional[str] = None
    group: str = ""   # "ssh" or "Slurm": the command line's argument group, the magics' help prefix
    #: the value ``Cluster()`` takes for the parsed one (None: the same)
    to_keyword: Optional[Callable[[Any], Any]] = None

    @property
    def dest(self) -> str:
        return self.flags[-1].lstrip("-").replace("-", "_")

    def argparse_kwargs(self, prefixed: bool = False, **override: Any) -> dict[str, Any]:
        """``add_argument``'s keywords (``prefixed``: the help starts with the group, for a parser without groups)."""
        kw: dict[str, Any] = {"help": f"{self.group}: {self.help}" if prefixed and self.group else self.help}
        if self.action:
            kw["action"] = self.action
        kw["default"] = list(self.default) if self.action == "append" and self.default is not None else self.default
        for name in ("choices", "metavar"):
            if getattr(self, name) is not None:
                kw[name] = getattr(self, name)
        if self.check is not None:
            kw["type"] = self.check
        kw.update(override)
        return kw


def _opt(flags: tuple[str, ...] | str, help: str, surfaces: str, **kw: Any) -> Option:
    if kw.get("action") == "store_true":
        kw.setdefault("default", False)
    return Option((flags,) if isinstance(flags, str) else flags, help, frozenset(surfaces.split()), **kw)


_CLUSTER = f"{START} {LAUNCH} {PANEL}"
_SSH = f"{START} {LAUNCH} {CONFIG}"
_SLURM = f"{START} {LAUNCH}"

SPEC: tuple[Option, ...] = (
    _opt(("-n", "--repeat-hosts"), "ranks per host, per node under Slurm (default: 1 per host named, as "
         "mlx.launch; 2 when none is named)", _CLUSTER, keyword="n", metavar="N",
         check=limits.arg_type(limits.ranks_per_host, "-n")),
    _opt("--hosts", "comma-separated hosts (an IP entry is also its IP; default: this machine)", _CLUSTER,
         keyword="hosts"),
    _opt("--hostfile", "JSON hostfile (a list, or {backend, envs, hosts}) instead of --hosts", _CLUSTER,
         keyword="hostfile"),
    _opt("--backend", f"{backends.listed()} (default: {backends.DEFAULT_RULE})", _CLUSTER, keyword="backend",
         choices=backends.NAMES),
    _opt("--python", "interpreter on the ranks, and for a .py script or a bare python/python3 command "
         "(default: this one)", f"{START} {LAUNCH}", keyword="python"),
    _opt("--env", "set an env var on every rank; a bare KEY passes this environment's value on (repeatable)",
         f"{START} {LAUNCH}", keyword="env", action="append", default=(), metavar="K=V"),
    _opt("--cwd", "working directory on every rank (default: this one, if it exists there)", f"{START} {LAUNCH}",
         keyword="cwd"),
    _opt("--timeout", "seconds to wait for the ranks", f"{START} {RESTART} {CONNECT}", keyword="timeout",
         default=60.0, check=limits.arg_type(limits.seconds, "--timeout", example="60")),
    _opt("--bind-to", "cores (default): each rank started on this machine runs on its own equal share of its "
         "CPUs, when there are at least as many as ranks (Linux; as mpirun binds); none: leave placement to the "
         "OS (e.g. for two jobs on one machine)", f"{START} {LAUNCH}", keyword="bind_to", default="cores",
         choices=POLICIES),
    _opt("--clean", "start the ranks empty (default: each rank keeps its names)", RESTART, action="store_true"),
    _opt("--record-state", "after each clean cell each rank records its names, so a rank that dies keeps them at "
         "restart", START, keyword="record_state", action="store_true"),
    _opt("--controller-ip", "remote hosts: an address of this machine they can reach (default: its name)", START,
         keyword="controller_ip", metavar="IP"),
    # ssh: how remote hosts are reached (the magics and the launcher pass them on as one SSHOptions)
    _opt("--accept-unknown-hosts", "accept hosts missing from known_hosts (a changed key is still refused)", _SSH,
         action="store_true", group="ssh"),
    _opt("--ssh-config", "ssh_config file(s) instead of ~/.ssh/config", _SSH, action="append", metavar="F",
         group="ssh"),
    _opt("--known-hosts", "known_hosts file instead of the config's UserKnownHostsFile (default "
         "~/.ssh/known_hosts)", _SSH, metavar="F", group="ssh"),
    _opt(("-i", "--identity"), "private key file(s)", _SSH, action="append", metavar="F", group="ssh"),
    _opt("--connect-timeout", "connect timeout in seconds (default %(default)g)", _SSH, default=10.0,
         metavar="S", group="ssh", check=limits.arg_type(limits.seconds, "--connect-timeout",
                                                         high=limits.MAX_SSH_SECONDS, example="10")),
    _opt("--keepalive-interval", "keepalive interval; a host silent for 4 intervals is declared lost", LAUNCH,
         default=1.0, metavar="S", group="ssh", check=limits.arg_type(limits.seconds, "--keepalive-interval",
                                                                     high=limits.MAX_SSH_SECONDS, example="1")),
    # Slurm: the ranks as one srun step of a Slurm job (the current allocation, or one held for them)
    _opt("--slurm", "run the ranks as Slurm tasks (-n: ranks per node): in the current allocation "
         "(SLURM_JOB_ID), else in a new one held for them", _SLURM, keyword="scheduler", action="store_true",
         group="Slurm", to_keyword=lambda on: "slurm" if on else None),
    _opt("--nodes", "nodes (default: the allocation's, else 1)", _SLURM, keyword="nodes", metavar="N",
         group="Slurm", check=limits.arg_type(limits.count, "--nodes", high=limits.MAX_NODES)),
    _opt("--partition", "partition for a new allocation", _SLURM, keyword="partition", metavar="P", group="Slurm"),
    _opt("--time", "time limit of a new allocation (Slurm's format: 30, 1:00:00, 1-0)", _SLURM, keyword="time",
         metavar="T", group="Slurm"),
    _opt("--account", "account to charge a new allocation to", _SLURM, keyword="account", metavar="A",
         group="Slurm"),
    _opt("--slurm-arg", "more sbatch options for a new allocation (srun options inside one); repeatable", _SLURM,
         keyword="slurm_args", action="append", default=(), metavar="ARG", group="Slurm", to_keyword=list),
    _opt("--keep-allocation", "keep the job after a rank fails, for %%mlx_cluster restart (default: release it)",
         START, keyword="on_failure", action="store_true", group="Slurm",
         to_keyword=lambda keep: "keep" if keep else "release"),
)

#: ``Cluster()``'s keywords that no command line offers (Python only), each with why
PYTHON_ONLY = {
    "starting_port": "ring: first port (0: a free block when every rank runs here)",
    "log_level": "the controller's and engines' log level",
    "ssh_options": "an SSHOptions: what the ssh flags give",
    "cell_channel": "cells straight to the ranks, beside the controller (MLX_JUPYTER_CELL_CHANNEL)",
    "slurm": "a whole SlurmOptions, instead of the Slurm flags",
    "context": "where it is driven from (restart_context: PYTHON, MAGICS, PANEL): what its messages advise",
}

_BY_DEST = {o.dest: o for o in SPEC}


def option(dest: str) -> Option:
    """The option whose parsed name is ``dest`` (``bind_to``, ``repeat_hosts``)."""
    return _BY_DEST[dest]


def on(surface: str, group: Optional[str] = None) -> Iterator[Option]:
    """The options ``surface`` offers, in the spec's order (``group``: only that group's)."""
    return (o for o in SPEC if surface in o.surfaces and (group is None or o.group == group))


def add_to_parser(parser: Any, surface: str, group: Optional[str] = None, prefixed: bool = False,
                  **defaults: Any) -> None:
    """Add ``surface``'s options (of ``group``) to an argparse parser or group; ``defaults`` by dest override."""
    for o in on(surface, group):
        parser.add_argument(*o.flags, **o.argparse_kwargs(prefixed, **(
            {"default": defaults[o.dest]} if o.dest in defaults else {})))


def cluster_kwargs(args: argparse.Namespace, surface: str = START) -> dict[str, Any]:
    """``Cluster()``'s keywords from ``surface``'s parsed options (the Slurm group's only with ``--slurm``)."""
    out = {}
    for o in on(surface):
        if o.keyword is None or (o.group == "Slurm" and not getattr(args, "slurm", False)):
            continue
        value = getattr(args, o.dest)
        out[o.keyword] = o.to_keyword(value) if o.to_keyword is not None else value
    return out


def given_without(args: argparse.Namespace, surface: str, group: str, switch: str) -> list[str]:
    """The flags of ``group`` given (not at their default) while ``switch`` (a dest) is off."""
    if getattr(args, switch, False):
        return []
    return [o.flags[-1] for o in on(surface, group)
            if o.dest != switch and getattr(args, o.dest, None) not in (None, False, [], ())]
