"""SSH for launching: parallel asyncssh connections (one per host); shell quoting is :mod:`.shell_quote`.

Connections honour the user's OpenSSH config (HostName, Port, User,
IdentityFile, ProxyJump). Host keys are verified against the known_hosts
files OpenSSH would read for that host (see :func:`resolve`), every ProxyJump
hop included; ``accept_unknown_hosts`` accepts only hosts with no recorded
key: a *changed* key is always refused.
Keepalives make a dead host show up as a lost connection within
``keepalive_interval * (keepalive_count_max + 1)`` seconds.
"""

from __future__ import annotations

import asyncio
import os
import re
import sys
import warnings
import weakref
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, Optional, Sequence

from mlx_jupyter.vocab import options
# re-exported (callers write ssh.quote, ssh.join, ...)
from mlx_jupyter.net.shell_quote import QuotingError as QuotingError, check_name as check_name, export as export
from mlx_jupyter.net.shell_quote import join as join, quote as quote, sh_command as sh_command

if TYPE_CHECKING:
    from asyncssh import SSHClient, SSHClientConnection, SSHKey, SSHKnownHosts


def _asyncssh() -> Any:
    """asyncssh, imported without the 5 ``CryptographyDeprecationWarning: DSA is deprecated`` (10
    lines) it prints as it names cryptography's DSA classes; only that warning, from asyncssh's
    modules, is silenced. Every use of asyncssh here imports it through this."""
    if "asyncssh" not in sys.modules:
        try:
            from cryptography.utils import CryptographyDeprecationWarning
        except ImportError:   # no cryptography: asyncssh cannot load either, and says so below
            pass
        else:
            warnings.filterwarnings("ignore", message=r"DSA is deprecated", category=CryptographyDeprecationWarning,
                                    module=r"asyncssh(\.|$)")
    import asyncssh

    return asyncssh


class SSHError(RuntimeError):
    """An ssh connection or command failed; the message names the host and the fix."""

    def __init__(self, host: str, message: str, *, prefixed: bool = True):
        super().__init__(f"ssh to {host}: {message}" if prefixed else message)
        self.host = host


# ----------------------------------------------------------------- options --

def _default_config() -> list[str]:
    path = Path("~/.ssh/config").expanduser()
    return [str(path)] if path.is_file() else []


@dataclass
class SSHOptions:
    """How to connect. Defaults follow OpenSSH: ~/.ssh/config, ~/.ssh/known_hosts, agent, keys."""

    config: list[str] | None = None            # ssh_config files; None: ~/.ssh/config if present
    known_hosts: str | None = None             # replaces the user files (config's UserKnownHostsFile, ~/.ssh/known_hosts)
    accept_unknown_hosts: bool = False          # accept (and warn about) hosts with no known key
    username: str | None = None
    port: int | None = None
    client_keys: list[str] | None = None        # identity files; None: config/agent/~/.ssh/id_*
    agent: bool = True                          # use SSH_AUTH_SOCK if set
    connect_timeout: float = options.option("connect_timeout").default    # the flags' defaults (mlx_jupyter.vocab.options)
    keepalive_interval: float = options.option("keepalive_interval").default
    keepalive_count_max: int = 3
    max_sessions: int = 10                      # sshd's MaxSessions (default 10): sessions per connection
    extra: dict[str, Any] = field(default_factory=dict)   # passed to asyncssh.connect as is

    def dead_after(self) -> float:
        """Seconds after which a silent host is declared lost."""
        return self.keepalive_interval * (self.keepalive_count_max + 1)


def add_arguments(parser: Any, title: str = "ssh", connect_timeout: Optional[float] = None,
                  keepalive: bool = True) -> None:
    """The ssh flags shared by the commands (launch, config), as an argparse group: the spec's
    (:mod:`mlx_jupyter.vocab.options`); ``keepalive``: the launcher's, else the configurator's."""
    g = parser.add_argument_group(title)
    defaults: dict[str, Any] = {} if connect_timeout is None else {"connect_timeout": connect_timeout}
    options.add_to_parser(g, options.LAUNCH if keepalive else options.CONFIG, group="ssh", **defaults)


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
    kw.update(opts.extra)
    return kw


# --------------------------------------------------------------- host keys --

#: OpenSSH's defaults when the config names no known_hosts files.
USER_KNOWN_HOSTS = ("~/.ssh/known_hosts", "~/.ssh/known_hosts2")
GLOBAL_KNOWN_HOSTS = ("/etc/ssh/ssh_known_hosts", "/etc/ssh/ssh_known_hosts2")
_MAX_JUMPS = 8


@dataclass
class Target:
    """A destination after ssh_config resolution: where it is and which known_hosts files vouch for it."""

    host: str                     # HostName
    port: int
    jump: str | None              # ProxyJump chain ("a,user@b:2222"), if any
    known_hosts_files: list[str]  # the existing files consulted, in order
    searched: list[str]           # every file looked for (for error messages)


def _local_user() -> str:
    import getpass

    try:
        return getpass.getuser()
    except (KeyError, OSError):
        return ""


def _expand_path(path: str, host: str, orig: str, port: int, user: str) -> str:
    """``~`` and OpenSSH's %-tokens (%d %h %n %p %r %u %%) in a known_hosts path."""
    tokens = {"d": str(Path.home()), "h": host, "n": orig, "p": str(port), "r": user, "u": _local_user(), "%": "%"}
    return os.path.expanduser(re.sub(r"%(.)", lambda m: tokens.get(m.group(1), m.group(0)), path))


def resolve(dest: str, opts: SSHOptions) -> Target:
    """Resolve ``dest`` through the ssh config and list the known_hosts files OpenSSH would read.

    User files: ``opts.known_hosts`` (``--known-hosts``), else the host's
    UserKnownHostsFile, else ~/.ssh/known_hosts{,2}; then its GlobalKnownHostsFile,
    else /etc/ssh/ssh_known_hosts{,2}. ``none`` names no file; missing files are skipped.
    """
    asyncssh = _asyncssh()
    kw = _connect_kwargs(dest, opts)
    config = {k: kw[k] for k in ("host", "config", "username", "port") if k in kw}
    try:  # config only: no keys loaded, nothing dialled
        o = asyncssh.SSHClientConnectionOptions(**config, client_keys=None, agent_path=None)
    except (OSError, ValueError, asyncssh.Error) as exc:
        raise SSHError(dest, f"cannot use the ssh config {config['config'] or '(none)'}: {exc}") from None
    users = [opts.known_hosts] if opts.known_hosts else o.config.get("UserKnownHostsFile", None)
    globals_ = o.config.get("GlobalKnownHostsFile", None)
    paths = [*(USER_KNOWN_HOSTS if users is None else users), *(GLOBAL_KNOWN_HOSTS if globals_ is None else globals_)]
    searched = list(dict.fromkeys(_expand_path(p, o.host, o.orig_host, o.port, o.username or "") for p in paths))
    jump = o.tunnel if isinstance(o.tunnel, str) and o.tunnel.lower() != "none" else None
    return Target(o.host, o.port, jump, [p for p in searched if os.path.isfile(p)], searched)


class HostKeys:
    """The known_hosts entries that vouch for one destination, and why a key was refused."""

    def __init__(self, dest: str, target: Target, accept_unknown: bool):
        asyncssh = _asyncssh()
        self.dest, self.target, self.accept_unknown = dest, target, accept_unknown
        self.changed_in: list[str] = []   # files that record a different key for the host
        self.name = target.host           # the name the key was looked up by (HostKeyAlias, else HostName)
        self._files: list[tuple[str, SSHKnownHosts]] = []
        for path in target.known_hosts_files:
            try:
                self._files.append((path, asyncssh.read_known_hosts(path)))
            except (OSError, ValueError) as exc:
                raise SSHError(dest, f"cannot read known_hosts file {path}: {exc} (fix or remove that entry)") from None

    def trusted(self, host: str, addr: str, port: int | None) -> tuple[list[SSHKey], list[SSHKey], list[SSHKey]]:
        """asyncssh's known_hosts callback: (host keys, CA keys, revoked keys) from every file."""
        found: tuple[list[SSHKey], list[SSHKey], list[SSHKey]] = ([], [], [])
        for _, known in self._files:
            for acc, part in zip(found, known.match(host, addr, port)[:3]):
                acc.extend(part)
        return found

    def allow_unlisted(self, host: str, addr: str, port: int, key: SSHKey) -> bool:
        """A key none of the files trusts: refuse it if the host has a recorded key, else maybe accept."""
        port_ = port if port != 22 else None
        self.name = host if port_ is None else f"[{host}]:{port}"
        for path, known in self._files:
            keys, cas = known.match(host, addr, port_)[:2]
            if keys or cas:
                self.changed_in.append(path)
        if self.changed_in or not self.accept_unknown:
            return False
        print(f"mlx-jupyter: warning: accepting the unknown host key of {host} ({addr}): {key.get_fingerprint()} "
              f"(not recorded in {', '.join(self.target.searched) or 'any known_hosts file'})", file=sys.stderr)
        return True

    def refusal(self, reason: str) -> SSHError:
        """The error for a refused host key, naming the host, the files and the fix."""
        t, name = self.target, self.name
        if self.changed_in:
            files = ", ".join(self.changed_in)
            return SSHError(self.dest, f"the host key of {name} has CHANGED: it differs from the one recorded in "
                                       f"{files} (was the host reinstalled? otherwise someone may be intercepting "
                                       f"the connection). Refused even with --accept-unknown-hosts; if the change "
                                       f"is expected, run `ssh-keygen -R {quote(name)} -f {quote(self.changed_in[0])}` "
                                       f"and connect once with `ssh {quote(self.dest)}` to record the new key")
        where = ", ".join(t.known_hosts_files) or f"no known_hosts file (looked for {', '.join(t.searched) or 'none'})"
        return SSHError(self.dest, f"host key not verifiable against {where} ({reason}); connect once with "
                                   f"`ssh {quote(self.dest)}` to record it, or pass --accept-unknown-hosts")


# connection -> why it closed (set by the client's connection_lost)
_lost: "weakref.WeakKeyDictionary[Any, str]" = weakref.WeakKeyDictionary()


def lost_reason(conn: Any) -> str | None:
    """Why ``conn`` closed unexpectedly (e.g. "Server not responding to keepalive"), if it did."""
    return _lost.get(conn)


def _client_class(keys: HostKeys) -> type[SSHClient]:
    """The asyncssh client: records why a connection was lost; host keys judged by ``keys``."""
    _asyncssh()
    from asyncssh import SSHClient

    class Client(SSHClient):
        def connection_made(self, conn: SSHClientConnection) -> None:
            self._conn = conn

        def connection_lost(self, exc: Exception | None) -> None:
            if exc is not None:
                _lost[self._conn] = getattr(exc, "reason", "") or str(exc) or type(exc).__name__

        def validate_host_public_key(self, host: str, addr: str, port: int, key: SSHKey) -> bool:
            # reached only for a key that no known_hosts entry trusts
            return keys.allow_unlisted(host, addr, port, key)

    return Client


# ------------------------------------------------------------- connections --

def describe_error(dest: str, exc: BaseException, opts: SSHOptions, keys: HostKeys | None = None) -> SSHError:
    """Turn an asyncssh/OS error into an :class:`SSHError` that says what to do."""
    asyncssh = _asyncssh()
    if isinstance(exc, asyncssh.HostKeyNotVerifiable):
        if keys is not None:
            return keys.refusal(exc.reason)
        return SSHError(dest, f"host key not verifiable ({exc.reason}); connect once with `ssh {dest}` to record "
                              "it, or pass --accept-unknown-hosts")
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


def _is_port(text: str) -> bool:
    """ASCII digits only: str.isdigit also takes "¹", which int() refuses."""
    return text.isascii() and text.isdigit()


def _split_hop(hop: str) -> tuple[str, int | None]:
    """A ProxyJump entry ``[user@]host[:port]`` -> (destination, port)."""
    user, sep, hostport = hop.rpartition("@")
    host, port = hostport, None
    if hostport.startswith("["):
        host, _, rest = hostport[1:].partition("]")
        port = int(rest[1:]) if rest.startswith(":") and _is_port(rest[1:]) else None
    elif hostport.count(":") == 1:
        name, _, p = hostport.partition(":")
        if _is_port(p):
            host, port = name, int(p)
    return (f"{user}@{host}" if sep else host), port


async def connect(dest: str, opts: SSHOptions | None = None, *, _tunnel: Any = None, _depth: int = 0) -> Any:
    """Open one authenticated connection to ``dest`` (``[user@]host`` or a config alias).

    ProxyJump hops are connected here too (not by asyncssh), so every hop's
    host key is checked against the files OpenSSH would use for that hop.
    """
    asyncssh = _asyncssh()
    opts = opts or SSHOptions()
    target = resolve(dest, opts)
    keys = HostKeys(dest, target, opts.accept_unknown_hosts)
    tunnel = _tunnel
    if tunnel is None and target.jump:
        if _depth >= _MAX_JUMPS:
            raise SSHError(dest, f"more than {_MAX_JUMPS} ProxyJump hops (a loop in the ssh config?)")
        for hop in target.jump.split(","):
            hop_dest, hop_port = _split_hop(hop.strip())
            try:
                # like `ssh -p P -J hop`: the port option is the destination's, not the hop's
                nxt = await connect(hop_dest, replace(opts, port=hop_port), _tunnel=tunnel, _depth=_depth + 1)
            except SSHError as exc:
                if tunnel is not None:
                    tunnel.close()
                raise SSHError(dest, f"via ProxyJump {hop}: {exc}") from None
            if tunnel is not None:
                nxt.set_tunnel(tunnel)   # closed along with the hop after it
            tunnel = nxt
    kw = _connect_kwargs(dest, opts)
    kw.update(known_hosts=keys.trusted, client_factory=_client_class(keys))
    if tunnel is not None:
        kw["tunnel"] = tunnel
    try:
        conn = await asyncssh.connect(**kw)
    except (asyncssh.Error, OSError, asyncio.TimeoutError) as exc:
        if tunnel is not None and _tunnel is None:
            tunnel.close()
        raise describe_error(dest, exc, opts, keys) from None
    if tunnel is not None and _tunnel is None:
        conn.set_tunnel(tunnel)
    return conn


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
        refused = [e for e in errors if isinstance(e, SSHError)]   # every one, by now
        if len(refused) == 1:
            raise refused[0]
        raise SSHError(", ".join(e.host for e in refused), "\n".join(str(e) for e in refused), prefixed=False)
    return dict(zip(unique, results))


async def run(conn: Any, command: str, timeout: float, host: str = "", stdin: str = "") -> Any:
    """Run a short command on an open connection, bounded by ``timeout``; ``stdin`` is written to the
    command's stdin, which stays open until it ends.

    On a timeout or cancellation the command's stdin reaches EOF (it may exit on that) before its
    session is closed; a command started while the call was cancelled is ended the same way.
    """
    opening = asyncio.ensure_future(conn.create_process(command))
    try:
        process = await asyncio.shield(opening)
    except asyncio.CancelledError:
        opening.add_done_callback(_end_when_open)
        raise
    try:
        if stdin:
            process.stdin.write(stdin)
        return await asyncio.wait_for(process.wait(check=False), timeout)
    except asyncio.TimeoutError:
        raise SSHError(host or "host", f"command did not finish within {timeout:g} s: {command}") from None
    finally:
        ending = asyncio.ensure_future(_end_session(process))
        _ending.add(ending)
        ending.add_done_callback(_ending.discard)
        await asyncio.shield(ending)


_ending: "set[asyncio.Future[None]]" = set()  # sessions being ended (a task needs a reference to finish)
END_GRACE = 1.0  # seconds a command gets to exit on EOF before its session is closed


def _end_when_open(opening: "asyncio.Future[Any]") -> None:
    if not opening.cancelled() and opening.exception() is None:
        ending = asyncio.ensure_future(_end_session(opening.result()))
        _ending.add(ending)
        ending.add_done_callback(_ending.discard)


async def _end_session(process: Any) -> None:
    """EOF, a moment to exit, then close: sshd leaves a running command's stdin open when the session closes."""
    if process.exit_status is None and process.exit_signal is None:
        try:
            process.stdin.write_eof()
            await asyncio.wait_for(process.wait_closed(), END_GRACE)
        except Exception:  # noqa: BLE001 - already closed, or it ignores EOF: closed below all the same
            pass
    process.close()
