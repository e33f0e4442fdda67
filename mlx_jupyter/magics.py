"""`%load_ext mlx_jupyter`: ``%mlx_cluster``, ``%%mlx_distributed``, ``%mlx_push``, ``%mlx_pull``.

Thin: every magic parses its options and calls :class:`mlx_jupyter.cluster.Cluster`, which owns
every rule (when the ranks get ``mx``/``world``/``group``, what is formed again after an abort).
"""

from __future__ import annotations

import argparse
import os
import threading
import time
from typing import Any, Optional

from IPython.core.magic import Magics, cell_magic, line_magic, magics_class
from IPython.core.magic_arguments import argument, magic_arguments, parse_argstring

from mlx_jupyter.vocab import limits, options
from mlx_jupyter.vocab.hosts import BOTH_HOST_SOURCES
from mlx_jupyter.magic_help import (CLUSTER_ACTIONS, cluster_action_help, cluster_actions_text, cluster_arguments,
                                   help_without_body, plain_help)
from mlx_jupyter.cluster.cells.targets import parse_targets
from mlx_jupyter.cluster.cells.text import MODES, format_bytes
from mlx_jupyter.ranks_progress import RanksProgressBar

#: the kernel's cluster (one per kernel)
_cluster: Optional[Any] = None


def current() -> Any:
    """The cluster the magics use: started by ``%mlx_cluster start`` or set by :func:`set_current` (or None)."""
    return _cluster


def set_current(cluster: Any) -> Any:
    """Make ``cluster`` the one ``%%mlx_distributed`` and the other magics use (``None``: none).

    For clusters started elsewhere (a widget, plain Python): its messages keep the restart of
    the context it was made with (``Cluster(context=MAGICS)`` for the magics' words). The previous
    cluster is not stopped; it is returned.
    """
    global _cluster
    previous, _cluster = _cluster, cluster
    return previous


class UsageError(Exception):
    """A magic was called wrongly or at the wrong time; shown without a traceback."""

    def _render_traceback_(self) -> list[str]:
        return [f"\x1b[0;31mUsageError\x1b[0m: {self}"]


#: each magic's options for an empty line (the usual ``%%mlx_distributed``): parsed once
_DEFAULTS: dict[Any, Any] = {}


def _parse(magic: Any, line: str) -> Any:
    """``magic``'s options from ``line``; a line the shell cannot split (an unclosed quote) is a UsageError."""
    from IPython.core.error import UsageError as ParseError

    try:
        if line.strip():
            return parse_argstring(magic, line)
        key = getattr(magic, "__func__", magic)
        if key not in _DEFAULTS:
            _DEFAULTS[key] = vars(parse_argstring(magic, ""))
        return argparse.Namespace(**_DEFAULTS[key])   # a new one each time: callers may change it
    except ValueError as exc:   # shlex: "No closing quotation", "No escaped character"
        raise UsageError(f"cannot split the options {line.strip()[:80]!r} into words ({exc}): "
                         "close the quote, or escape it with a backslash") from None
    except ParseError as exc:   # argparse's: one kind of usage error for every mistake
        raise UsageError(str(exc)) from None


_SECONDS = options.option("timeout").check


@magics_class
class MLXMagics(Magics):
    """The magics; see the module docstring."""

    # ------------------------------------------------------------ %mlx_cluster

    @magic_arguments()
    @argument("action", nargs="?", default=None, choices=list(CLUSTER_ACTIONS),
              help="what to do (none: list the actions; help ACTION: its options)")
    @argument("cluster_id", nargs="?", default=None,
              help="connect: the cluster to use (as the MLX Cluster panel lists it; default: the only one)")
    @argument("-h", "--help", action="store_true", help="show the action's options")
    @cluster_arguments   # every option of start, restart and connect: mlx_jupyter.vocab.options
    @line_magic
    def mlx_cluster(self, line: str) -> Any:
        """Start, stop, restart or show the MLX cluster of this kernel."""
        global _cluster
        args = _parse(self.mlx_cluster, line)
        if args.action is None or args.action == "help" or args.help:
            self._cluster_help(args.cluster_id if args.action == "help" else args.action)
            return None
        from mlx_jupyter.cluster import Cluster, ClusterError, ConnectedCluster
        from mlx_jupyter.cluster.restart_context import MAGICS

        if args.cluster_id is not None and args.action != "connect":
            raise UsageError(f"%mlx_cluster {args.action} takes no cluster id (only connect does)")
        if args.action in ("connect", "start") and _cluster is not None and _cluster.running:
            _leave_if_gone()
        if args.action == "connect":
            if _cluster is not None and _cluster.running:
                raise UsageError(f"this kernel already uses a cluster ({_cluster.cluster_id}): %mlx_cluster stop "
                                 "first" + (" (it only disconnects)" if isinstance(_cluster, ConnectedCluster) else ""))
            try:
                cluster = Cluster.connect(args.cluster_id, timeout=args.timeout, context=MAGICS)
            except ClusterError as exc:
                raise UsageError(str(exc)) from None
            _cluster = cluster
            print(f"connected to {cluster.cluster_id}: {cluster.size} ranks ({cluster.backend}; engine id = rank), "
                  f"started by {cluster.owner_text()}")
            return None
        if args.action == "start":
            if _cluster is not None and _cluster.running:
                if isinstance(_cluster, ConnectedCluster):
                    raise UsageError(f"this notebook is connected to {_cluster.cluster_id}: %mlx_cluster stop "
                                     "first (it only disconnects)")
                raise UsageError("a cluster is already running: %mlx_cluster restart, or %mlx_cluster stop first")
            if args.hosts and args.hostfile:
                raise UsageError(f"--hosts and --hostfile: {BOTH_HOST_SOURCES}")
            from mlx_jupyter.hostfile import parse_env

            env, problems = parse_env(args.env, "--env", passthrough=os.environ)
            if problems:
                raise UsageError("; ".join(p.removesuffix("; skipped") for p in problems))
            from mlx_jupyter.net.ssh import SSHOptions, options_from_args

            ssh_options = options_from_args(args)
            try:  # an unreadable hostfile: say so now, before starting anything
                cluster = Cluster(**{**start_kwargs(args), "env": env, "context": MAGICS,
                                     "ssh_options": None if ssh_options == SSHOptions() else ssh_options})
                total = cluster.expected_size()
            except (OSError, ValueError) as exc:
                raise UsageError(f"--hostfile {args.hostfile}: {exc}" if args.hostfile else str(exc)) from None
            progress = RanksProgressBar(total, "starting")
            allocation = getattr(cluster, "allocation", None)
            if allocation is not None:
                allocation.opts.on_state = progress.slurm_state
            try:
                cluster.start(progress=progress)
            except (ClusterError, Exception) as exc:
                progress.failed()
                raise UsageError(f"the cluster did not start: {exc}") from None
            _cluster = cluster
            where = f"; Slurm job {allocation.job_id} on {','.join(allocation.nodes)}" if allocation is not None else ""
            progress.done(f"{cluster.size} ranks ready in {cluster.ready_time:.2f} s "
                          f"({cluster.backend}; engine id = rank{where})")
            return None
        if _cluster is None or not _cluster.running:
            if args.action == "stop":
                print("no cluster running")
                return None
            raise UsageError("no cluster running: %mlx_cluster start")
        if args.action == "stop":
            connected = _cluster if isinstance(_cluster, ConnectedCluster) else None
            gone = connected.gone() if connected is not None else None
            _cluster.stop()
            _cluster = None
            if connected is None:
                print("cluster stopped")
            elif gone:
                print(f"disconnected from {connected.cluster_id}, which no longer runs: {gone}")
            else:
                where = ("with the MLX Cluster panel's Stop button" if connected.by_server else
                         "in the notebook that started it, with %mlx_cluster stop")
                print(f"disconnected from {connected.cluster_id}; it keeps running (stop it {where})")
        elif args.action == "restart":
            if isinstance(_cluster, ConnectedCluster):   # refused at once by the owner's rule: no progress bar first
                try:
                    _cluster.restart(timeout=args.timeout, clean=args.clean, quiet=True)
                except ClusterError as exc:
                    raise UsageError(f"restart refused: {exc}") from None
            progress = RanksProgressBar(_cluster.size, "restarting")
            t0 = time.perf_counter()
            try:
                _cluster.restart(progress=progress, timeout=args.timeout, clean=args.clean, quiet=True)
            except ClusterError as exc:
                progress.failed()
                raise UsageError(f"restart failed: {exc}") from None
            progress.done(f"{_cluster.size} ranks restarted in {time.perf_counter() - t0:.2f} s (same ranks, same ids)")
            if _cluster.last_restart:
                print(_cluster.last_restart)
        elif args.action == "where":
            from IPython.display import publish_display_data

            where = _cluster.where()
            publish_display_data({"text/plain": str(where), "text/html": where._repr_html_()})
        else:
            from mlx_jupyter.cluster.restart_origins import status_column

            rows = _cluster.status()
            status_column(_cluster, rows)   # where each rank's names came from at the last restart
            self._show_status(rows)
            if getattr(_cluster, "allocation", None) is not None:
                print(_cluster.allocation.summary())
        return None

    def _cluster_help(self, action: Optional[str]) -> None:
        """The actions (``action`` None) or one action's options."""
        if action is None:
            print(cluster_actions_text())
            return
        try:
            print(cluster_action_help(self.mlx_cluster, action), end="")
        except ValueError as exc:
            raise UsageError(str(exc)) from None

    def _show_status(self, rows: list[dict]) -> None:
        from IPython.display import publish_display_data

        cols = ["rank", "host", "pid", "state", "backend", "memory"]
        table = [[str(r["rank"]), str(r["host"]), str(r["pid"]), str(r["state"]) +
                  (" (world closed)" if r.get("world_closed") else ""), str(r["backend"]), format_bytes(r["memory"])]
                 for r in rows]
        if any("restart" in r for r in rows):   # after a keep-state restart: where each rank's names came from
            cols.append("names at restart")
            for t, r in zip(table, rows):
                t.append(str(r.get("restart", "")))
        widths = [max(len(c), *(len(t[i]) for t in table)) for i, c in enumerate(cols)]
        text = "\n".join(["  ".join(c.ljust(w) for c, w in zip(cols, widths))] +
                         ["  ".join(v.ljust(w) for v, w in zip(t, widths)) for t in table])
        html = "<table><tr>" + "".join(f"<th>{c}</th>" for c in cols) + "</tr>" + "".join(
            "<tr>" + "".join(f"<td>{v}</td>" for v in t) + "</tr>" for t in table) + "</table>"
        publish_display_data({"text/plain": text, "text/html": html})

    # ------------------------------------------------------------ %%mlx_distributed

    @magic_arguments("%mlx_distributed")  # IPython adds one %
    @argument("-h", "--help", action="store_true", help="show these options (the cell is not run)")
    @argument("--targets", "-t", default="all", help="ranks to run on: all, 0, 0,2, 1-3, :2")
    @argument("--block", dest="block", action="store_true", default=True, help="wait and show output (default)")
    @argument("--noblock", dest="block", action="store_false", help="return a CellRun at once")
    @argument("--timeout", type=_SECONDS, default=None, help="interrupt every rank after S seconds")
    @argument("--output", choices=MODES, default="grouped", help="grouped (default), rank or raw")
    @argument("--no-init", dest="init", action="store_false", default=True,
              help="do not define mx/world/group on the ranks first (nor mend them after an abort)")
    @argument("--profile", action="store_true",
              help="record every op of our core on the ranks; show a timeline and a summary after the cell")
    @cell_magic
    def mlx_distributed(self, line: str, cell: str) -> Any:
        """Run the cell on every rank (or --targets); no cell ever hangs."""
        from mlx_jupyter.cluster.cells import reply_tail
        from mlx_jupyter.cluster.cells.display import show_run
        from mlx_jupyter.cluster.shared.errors import ClusterError   # (the package's lazy names cost a look-up a cell)

        args = _parse(self.mlx_distributed, line)
        if args.help:
            print(plain_help(self.mlx_distributed.parser.format_help()), end="")
            return None
        cluster = self._need_cluster()
        try:
            targets = parse_targets(args.targets, cluster.size)
        except ValueError as exc:
            raise UsageError(str(exc)) from None
        if args.profile and not args.block:
            raise UsageError("--profile shows the profile after the cell: use it without --noblock "
                             "(or Cluster.run(code, profile=True), then Cluster.profile())")
        timeout = _wait_for_owner_cell(cluster, targets, args.timeout)
        try:
            # the cell's code is on the editor's lines 2 and on (line 1: %%mlx_distributed)
            run = cluster.run(cell, targets, init=args.init, profile=args.profile, first_line=2)
        except ClusterError as exc:
            raise UsageError(str(exc)) from None
        if not args.block:
            return run
        try:
            show_run(run, args.output, timeout)
        finally:
            if args.profile:
                from mlx_jupyter.cluster.cells.profile_view import show_profile

                show_profile(cluster)
            reply_tail.skip_for_this_request(self.shell)   # its output is out: no flush round trips, no sleep
        return None

    @magic_arguments()
    @argument("rank", nargs="?", type=limits.arg_type(limits.count, "%mlx_debug", low=0, high=1 << 20, what="a rank",
                                                      example="0"), default=None,
              help="the rank to debug (default: the first rank that raised in the last failed cell)")
    @argument("-c", "--commands", default="", metavar="COMMANDS",
              help='pdb commands separated by ";" run without prompting, e.g. -c "p locals(); where"')
    @argument("--all", action="store_true",
              help="every rank's last traceback at once: one prompt for all, answers grouped ('rank N cmd': one rank)")
    @line_magic
    def mlx_debug(self, line: str) -> None:
        """Post-mortem pdb on a rank's last traceback, in its namespace (prompts through the notebook)."""
        from mlx_jupyter.cluster import ClusterError
        from mlx_jupyter.cluster.cells.display import show_run

        args = _parse(self.mlx_debug, line)
        cluster = self._need_cluster()
        try:
            commands = args.commands
            if len(commands) >= 2 and commands[0] == commands[-1] and commands[0] in "\"'":
                commands = commands[1:-1]  # IPython's argument split keeps the quotes
            if args.all and args.rank is not None:
                raise ClusterError(f"%mlx_debug: name a rank ({args.rank}) or --all, not both")
            if args.all:  # each rank's post-mortem, one cell: their prompts share one (cells.debug)
                code = ("__import__('mlx_jupyter.cluster.rank.debugger', fromlist=['post_mortem'])"
                        f".post_mortem({commands!r}, grouped=True)")
                run = cluster.run(code, None, init=False)
            else:
                run = cluster.debug(args.rank, commands)
        except ClusterError as exc:
            raise UsageError(str(exc)) from None
        show_run(run)

    def _need_cluster(self) -> Any:
        if _cluster is None or not _cluster.running:
            raise UsageError("no cluster running: %mlx_cluster start")
        return _cluster

    # ------------------------------------------------------------ data

    @magic_arguments()
    @argument("names", nargs="+", help="notebook variables to send (name, or name=expression)")
    @argument("--targets", "-t", default="all", help="ranks to send to")
    @line_magic
    def mlx_push(self, line: str) -> None:
        """Send notebook variables to the ranks: ``%mlx_push x y`` or ``%mlx_push w=weights``."""
        args = _parse(self.mlx_push, line)
        cluster = self._need_cluster()
        ns = {}
        for item in args.names:
            name, sep, expr = item.partition("=")
            try:
                ns[name] = eval(expr if sep else name, self.shell.user_ns)
            except Exception as exc:
                raise UsageError(f"cannot evaluate {expr if sep else name!r} in the notebook: {exc}") from None
        from mlx_jupyter.cluster import ClusterError

        try:
            cluster.push(ns, parse_targets(args.targets, cluster.size))
        except (ClusterError, ValueError) as exc:
            raise UsageError(str(exc)) from None

    @magic_arguments()
    @argument("name", help="variable to fetch from every rank")
    @argument("--targets", "-t", default="all", help="ranks to fetch from")
    @argument("--gather", action="store_true", help="concatenate the ranks' values (lists, arrays) in rank order")
    @argument("--into", default=None, help="also bind the result to this notebook variable")
    @line_magic
    def mlx_pull(self, line: str) -> Any:
        """Fetch a variable from the ranks: a list in rank order (``--gather``: concatenated)."""
        args = _parse(self.mlx_pull, line)
        cluster = self._need_cluster()
        from mlx_jupyter.cluster import ClusterError

        try:
            targets = parse_targets(args.targets, cluster.size)
            if args.gather:
                value = cluster.gather(args.name, targets)
            else:
                value = cluster.pull(args.name, targets)
        except (ClusterError, ValueError) as exc:
            raise UsageError(str(exc)) from None
        except Exception as exc:  # e.g. NameError on a rank
            raise UsageError(f"pulling {args.name!r} failed: {type(exc).__name__}: {exc}") from None
        if args.into:
            self.shell.user_ns[args.into] = value
        return value


def _wait_for_owner_cell(cluster: Any, targets: list[int], timeout: Optional[float]) -> Optional[float]:
    """A connected notebook whose ranks run the owner's cell: say so at once, then wait for it to end
    (at most ``timeout`` s: the cell is then not sent, and the owner's cell goes on). The timeout left."""
    from mlx_jupyter.cluster import ConnectedCluster

    if not isinstance(cluster, ConnectedCluster):
        return timeout
    held = cluster.cell_holding(targets)
    if held is None:
        return timeout
    print(f"waiting: {held}; this cell runs once it ends "
          f"({f'or gives up after --timeout {timeout:g} s' if timeout is not None else 'interrupt to give up'})",
          flush=True)
    t0 = time.monotonic()
    deadline = None if timeout is None else t0 + timeout
    pause = threading.Event()  # never set: a bounded wait between two looks at the owner's listing
    try:
        while held is not None:
            if deadline is not None and time.monotonic() >= deadline:
                raise UsageError(f"the cell did not run: {held}, and it did not end within --timeout {timeout:g} s")
            pause.wait(0.2)
            held = cluster.cell_holding(targets)
    except KeyboardInterrupt:
        raise UsageError(f"the cell did not run (interrupted while waiting: {held})") from None
    return None if timeout is None else max(timeout - (time.monotonic() - t0), 0.1)


def _leave_if_gone() -> None:
    """A connected cluster that no longer runs (stopped by its owner, or the owner died) is left, saying so."""
    global _cluster
    from mlx_jupyter.cluster import ConnectedCluster

    gone = _cluster.gone() if isinstance(_cluster, ConnectedCluster) else None
    if gone:
        left = _cluster.cluster_id
        _cluster.stop()
        _cluster = None
        print(f"left {left}, which no longer runs: {gone}")


def start_kwargs(args: Any) -> dict[str, Any]:
    """``Cluster``'s arguments from ``%mlx_cluster start``'s (the spec's; a Slurm flag without --slurm is a
    usage error)."""
    given = options.given_without(args, options.START, "Slurm", "slurm")
    if given:
        raise UsageError(f"{', '.join(given)} only mean something with --slurm")
    if args.slurm and (args.hosts or args.hostfile):
        raise UsageError("--slurm takes its nodes from Slurm: no --hosts or --hostfile")
    return options.cluster_kwargs(args, options.START)


def load_ipython_extension(ip: Any) -> None:
    """Register the magics (``%load_ext mlx_jupyter``)."""
    ip.register_magics(MLXMagics)
    cleanup = getattr(ip, "input_transformers_cleanup", None)
    if cleanup is not None and help_without_body not in cleanup:
        cleanup.append(help_without_body)


def unload_ipython_extension(ip: Any) -> None:
    """Stop the cluster when the extension is unloaded."""
    global _cluster
    cleanup = getattr(ip, "input_transformers_cleanup", None)
    if cleanup is not None and help_without_body in cleanup:
        cleanup.remove(help_without_body)
    if _cluster is not None:
        _cluster.stop()
        _cluster = None
