"""SSH for launching: parallel asyncssh connections (one per host) and shell quoting.

Connections honour the user's OpenSSH config (HostName, Port, User,
IdentityFile, ProxyJump) and known_hosts; host keys are verified unless
``accept_unknown_hosts`` is set, which still refuses a *changed* key.
Keepalives make a dead host show up as a lost connection within
``keepalive_interval * (keepalive_count_max + 1)`` seconds.
"""

from __future__ import annotations

import asyncio
import os
import re
import shlex
import sys
import weakref
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping, Sequence

#: Environment variable names we export on a remote host.
_ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


class SSHError(RuntimeError):
    """An ssh connection or command failed; the message names the host and the fix."""

    def __init__(self, host: str, message: str, *, prefixed: bool = True):
        super().__init__(f"ssh to {host}: {message}" if prefixed else message)
        self.host = host


class QuotingError(ValueError):
    """A value cannot be passed to a remote shell literally (e.g. it contains NUL)."""


# ----------------------------------------------------------------- quoting --

def quote(value: str | os.PathLike[str]) -> str:
    """Quote one word for a POSIX shell so that it arrives literally (NUL refused)."""
    text = os.fspath(value)
    if "\0" in text:
        raise QuotingError(f"{text!r}: a NUL byte cannot be passed through a shell")
    return shlex.quote(text)


def join(argv: Sequence[str | os.PathLike[str]]) -> str:
    """Quote every word of ``argv`` and join them with spaces."""
    return " ".join(quote(a) for a in argv)


def check_name(name: str) -> str:
    """Return ``name`` if it is a shell variable name, else raise :class:`QuotingError`."""
    if not _ENV_NAME.match(name):
        raise QuotingError(f"{name!r} is not a valid environment variable name ([A-Za-z_][A-Za-z0-9_]*)")
    return name


def export(name: str, value: str) -> str:
    """``export NAME='value'``; the name must be a shell identifier."""
    return f"export {check_name(name)}={quote(value)}"


def sh_command(script: str) -> str:
    """Run ``script`` under ``/bin/sh`` whatever the remote login shell is (bash, zsh, ...)."""
    return f"exec /bin/sh -c {quote(script)}"


# ----------------------------------------------------------------- options --

def _default_config() -> list[str]:
    path = Path("~/.ssh/config").expanduser()
    return [str(path)] if path.is_file() else []


@dataclass
class SSHOptions:
    """How to connect. Defaults follow OpenSSH: ~/.ssh/config, ~/.ssh/known_hosts, agent, keys."""

    config: list[str] | None = None            # ssh_config files; None: ~/.ssh/config if present
    known_hosts: str | None = None             # None: ~/.ssh/known_hosts (or the config's UserKnownHostsFile)
    accept_unknown_hosts: bool = False          # accept (and warn about) hosts with no known key
    username: str | None = None
    port: int | None = None
    client_keys: list[str] | None = None        # identity files; None: config/agent/~/.ssh/id_*
    agent: bool = True                          # use SSH_AUTH_SOCK if set
    connect_timeout: float = 10.0
    keepalive_interval: float = 1.0
    keepalive_count_max: int = 3
    max_sessions: int = 10                      # sshd's MaxSessions (default 10): sessions per connection
    extra: dict[str, Any] = field(default_factory=dict)   # passed to asyncssh.connect as is

    def dead_after(self) -> float:
        """Seconds after which a silent host is declared lost."""
        return self.keepalive_interval * (self.keepalive_count_max + 1)


def add_arguments(parser: Any, title: str = "ssh", connect_timeout: float = 10.0, keepalive: bool = True) -> None:
    """The ssh flags shared by the commands (launch, config), as an argparse group."""
    g = parser.add_argument_group(title)
    g.add_argument("--accept-unknown-hosts", action="store_true",
                   help="accept hosts missing from known_hosts (a changed key is still refused)")
    g.add_argument("--ssh-config", action="append", metavar="F", help="ssh_config file(s) instead of ~/.ssh/config")
    g.add_argument("--known-hosts", metavar="F", help="known_hosts file instead of ~/.ssh/known_hosts")
    g.add_argument("-i", "--identity", action="append", metavar="F", help="private key file(s)")
    g.add_argument("--connect-timeout", type=float, default=connect_timeout, metavar="S",
                   help=f"ssh connect timeout (default {connect_timeout:g})")
    if keepalive:
        g.add_argument("--keepalive-interval", type=float, default=1.0, metavar="S",
                       help="ssh keepalive interval; a host silent for 4 intervals is declared lost")


def options_from_args(args: Any) -> "SSHOptions":
    """The `SSHOptions` that the flags of `add_arguments` ask for."""
    extra = {"keepalive_interval": args.keepalive_interval} if hasattr(args, "keepalive_interval") else {}
    return SSHOptions(config=args.ssh_config, known_hosts=args.known_hosts, accept_unknown_hosts=args.accept_unknown_hosts,
                      client_keys=args.identity, connect_timeout=args.connect_timeout, **extra)


def split_destination(dest: str) -> tuple[str | None, str]:
    """``user@host`` -> (user, host); ``[v6]`` brackets removed."""
    user, sep, host = dest.rpartition("@")
    host = host[1:-1] if host.startswith("[") and host.endswith("]") else host
    return (user if sep else None), host


def _connect_kwargs(dest: str, opts: SSHOptions) -> dict[str, Any]:
    import asyncssh

    user, host = split_destination(dest)
    kw: dict[str, Any] = {
        "host": host,
        "config": opts.config if opts.config is not None else _default_config(),
        "connect_timeout": opts.connect_timeout,
        "keepalive_interval": opts.keepalive_interval,
        "keepalive_count_max": opts.keepalive_count_max,
    }
    if user or opts.username:
        kw["username"] = user or opts.username
    if opts.port:
        kw["port"] = opts.port
    if opts.client_keys is not None:
        kw["client_keys"] = list(opts.client_keys)
    if not opts.agent:
        kw["agent_path"] = None
    if opts.known_hosts is not None:
        kw["known_hosts"] = opts.known_hosts
    kw["client_factory"] = _client_class(opts)
    kw.update(opts.extra)
    return kw


def _known_hosts_files(opts: SSHOptions) -> list[str]:
    if opts.known_hosts:
        return [opts.known_hosts]
    default = Path("~/.ssh/known_hosts").expanduser()
    return [str(default)] if default.is_file() else []


# connection -> why it closed (set by the client's connection_lost)
_lost: "weakref.WeakKeyDictionary[Any, str]" = weakref.WeakKeyDictionary()


def lost_reason(conn: Any) -> str | None:
    """Why ``conn`` closed unexpectedly (e.g. "Server not responding to keepalive"), if it did."""
    return _lost.get(conn)


def _client_class(opts: SSHOptions) -> Any:
    """The asyncssh client: records why a connection was lost; optionally accepts unknown hosts."""
    import asyncssh

    files = _known_hosts_files(opts)
    accept = opts.accept_unknown_hosts

    class Client(asyncssh.SSHClient):
        def connection_made(self, conn: Any) -> None:
            self._conn = conn

        def connection_lost(self, exc: Exception | None) -> None:
            if exc is not None:
                _lost[self._conn] = getattr(exc, "reason", "") or str(exc) or type(exc).__name__

        def validate_host_public_key(self, host: str, addr: str, port: int, key: Any) -> bool:
            # Reached only when the key is not among the trusted ones: accept it
            # if the host is unknown, refuse it if the host has another key.
            if not accept:
                return False
            for path in files:
                try:
                    known = asyncssh.match_known_hosts(path, host, addr, port if port != 22 else None)
                except (OSError, ValueError):
                    continue
                if known[0] or known[1]:
                    return False
            print(
                f"mlx-jupyter: warning: accepting unknown host key for {host} ({addr}): "
                f"{key.get_fingerprint()}",
                file=sys.stderr,
            )
            return True

    return Client


# ------------------------------------------------------------- connections --

def describe_error(dest: str, exc: BaseException, opts: SSHOptions) -> SSHError:
    """Turn an asyncssh/OS error into an :class:`SSHError` that says what to do."""
    import asyncssh

    if isinstance(exc, asyncssh.HostKeyNotVerifiable):
        where = opts.known_hosts or "~/.ssh/known_hosts"
        return SSHError(dest, f"host key not verifiable against {where} ({exc.reason}); connect once with "
                              f"`ssh {dest}` to record it, or pass --accept-unknown-hosts")
    if isinstance(exc, asyncssh.PermissionDenied):
        return SSHError(dest, "authentication failed (no accepted key); check User/IdentityFile in "
                              "~/.ssh/config or your ssh agent")
    if isinstance(exc, asyncssh.ConnectionLost):
        return SSHError(dest, f"connection lost ({exc.reason or 'closed by the remote side'})")
    if isinstance(exc, asyncssh.DisconnectError):
        return SSHError(dest, f"disconnected: {exc.reason}")
    if isinstance(exc, (asyncio.TimeoutError, TimeoutError)):
        return SSHError(dest, f"no answer within {opts.connect_timeout:g} s (host down, cut off or firewalled?)")
    if isinstance(exc, ConnectionRefusedError):
        return SSHError(dest, "connection refused (is sshd running there, on the right port?)")
    if isinstance(exc, OSError):
        return SSHError(dest, f"{exc.strerror or exc} (check the name, HostName in ~/.ssh/config, the network)")
    return SSHError(dest, f"{type(exc).__name__}: {exc}")


async def connect(dest: str, opts: SSHOptions | None = None) -> Any:
    """Open one authenticated connection to ``dest`` (``[user@]host`` or a config alias)."""
    import asyncssh

    opts = opts or SSHOptions()
    try:
        return await asyncssh.connect(**_connect_kwargs(dest, opts))
    except (asyncssh.Error, OSError, asyncio.TimeoutError) as exc:
        raise describe_error(dest, exc, opts) from None


async def connect_all(dests: Sequence[str], opts: SSHOptions | None = None) -> dict[str, Any]:
    """Connect to every distinct destination in parallel; on any failure close all and raise one error."""
    opts = opts or SSHOptions()
    unique = list(dict.fromkeys(dests))
    results = await asyncio.gather(*(connect(d, opts) for d in unique), return_exceptions=True)
    errors = [r for r in results if isinstance(r, BaseException)]
    if errors:
        for r in results:
            if not isinstance(r, BaseException):
                r.abort()
        for e in errors:
            if not isinstance(e, SSHError):
                raise e
        if len(errors) == 1:
            raise errors[0]
        raise SSHError(", ".join(e.host for e in errors), "\n".join(str(e) for e in errors), prefixed=False)
    return dict(zip(unique, results))


async def run(conn: Any, command: str, timeout: float, host: str = "") -> Any:
    """Run a short command on an open connection, bounded by ``timeout``."""
    try:
        return await asyncio.wait_for(conn.run(command, check=False), timeout)
    except asyncio.TimeoutError:
        raise SSHError(host or "host", f"command did not finish within {timeout:g} s: {command}") from None


def env_exports(env: Mapping[str, str]) -> list[str]:
    """``export`` lines for an environment mapping (names validated, values quoted)."""
    return [export(k, v) for k, v in env.items()]
