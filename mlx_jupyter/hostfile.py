"""Hosts and hostfiles: parse, validate and write both JSON forms; ring port plans.

Pure: no I/O beyond reading/writing the hostfile itself (read through :mod:`mlx_jupyter.safe_read`,
the one reader of every entry point). A hostfile is either a plain JSON list of hosts or the object
form ``{"backend": "...", "envs": ["K=V"], "hosts": [...]}``; each host is
``{"ssh": "name", "ips": ["10.0.0.1"], "rdma": [null, "rdma_en5"]}``. Unknown fields are ignored
with one warning, as MLX ignores them; a near miss of a known one (``"ip"``) is refused.
"""

from __future__ import annotations

import json
import re
import reprlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable, Mapping, Sequence, Union

from mlx_jupyter.vocab.backends import NAMES, default_backend  # noqa: F401  (default_backend: re-exported)
from mlx_jupyter.vocab import rank_env
from mlx_jupyter.vocab.limits import MAX_RANKS
from mlx_jupyter.vocab.hosts import format_addr, is_ip, runs_here
from mlx_jupyter.vocab.ports import CORE_PORT_OFFSET, DEFAULT_STARTING_PORT
from mlx_jupyter.suggest import typo_of

RdmaEntry = Union[str, list[str], None]

#: Backends a launcher knows how to start (the one list, from their records; the configurator plans a subset).
BACKENDS = NAMES


def default_ranks_per_host(hosts_named: bool) -> int:
    """Ranks per host when none is given, for every way in: one per host, as ``mlx.launch -n``;
    two when no host is named at all (this machine alone), since one rank would not be distributed."""
    return 1 if hosts_named else 2

# An ssh destination: optional "user@", then a DNS name, an IPv4 or a bracketed
# or bare IPv6 address. Anything else (spaces, quotes, ;, $, `, newlines, a
# leading "-" that ssh would read as an option) is refused.
_SSH_NAME = re.compile(r"^(?:[A-Za-z0-9_][A-Za-z0-9._+-]*@)?(?:[A-Za-z0-9_][A-Za-z0-9._-]*|\[?[0-9A-Fa-f:.]+(?:%[A-Za-z0-9_.-]+)?\]?)$")
_ENV_KEY = re.compile(r"^[A-Za-z0-9_]+$")
TOP_FIELDS = ("backend", "envs", "hosts")
HOST_FIELDS = ("ssh", "ips", "rdma")
#: JSON nesting a hostfile may have (it needs 5; annotations under unknown fields may add some)
MAX_DEPTH = 32
_short = reprlib.Repr()
_short.maxstring, _short.maxother, _short.maxlevel = 40, 40, 3


class HostfileError(ValueError):
    """A hostfile or host list is malformed; the message names file, host and field.

    ``entry``: the index of the host entry at fault, if one is (for messages that must not quote the file).
    """

    entry: int | None = None


@dataclass
class Host:
    """One machine: how to reach it (``ssh``), its IPs for the data plane, its RDMA devices."""

    ssh: str
    ips: list[str] = field(default_factory=list)
    rdma: list[RdmaEntry] = field(default_factory=list)

    @property
    def is_local(self) -> bool:
        """Whether ranks on this host run here without ssh (:func:`mlx_jupyter.vocab.hosts.runs_here`)."""
        return runs_here(self.ssh)

    def to_json(self) -> dict[str, Any]:
        """The hostfile entry for this host: ``rdma`` always written (``[]`` for none), as MLX writes it."""
        return {"ssh": self.ssh, "ips": list(self.ips), "rdma": list(self.rdma)}


@dataclass
class Hostfile:
    """A parsed hostfile: hosts in rank order, plus the object form's backend and envs."""

    hosts: list[Host]
    backend: str | None = None
    envs: list[str] = field(default_factory=list)
    #: what reading it warned about (unknown fields ignored); not part of what it says
    warnings: list[str] = field(default_factory=list, compare=False)


def check_ssh_name(name: Any, where: str = "host") -> str:
    """Return ``name`` if it is a safe ssh destination, else raise naming ``where``."""
    if not isinstance(name, str) or not name:
        raise HostfileError(f"{where}: the host name is empty; give a DNS name or an IP")
    if not _SSH_NAME.fullmatch(name):   # fullmatch: `$` alone lets a trailing newline through
        raise HostfileError(
            f"{where}: host name {name!r} is not a valid host name or address "
            "(letters, digits, '.', '-', '_', optionally 'user@'; it may not start with '-')"
        )
    return name


def check_env_key(key: str) -> bool:
    """Whether ``key`` is an acceptable environment variable name (``[A-Za-z0-9_]+``)."""
    return bool(_ENV_KEY.fullmatch(key)) and not key[0].isdigit()


def parse_env(items: Iterable[str], where: str = "--env",
              passthrough: Mapping[str, str] | None = None) -> tuple[dict[str, str], list[str]]:
    """Split ``K=V`` strings into a dict; return it and warnings for the items skipped.

    A bare ``KEY`` takes its value from ``passthrough`` (the launcher's environment, as
    ``ssh -o SendEnv``); without ``passthrough``, or when it lacks ``KEY``, it is skipped.
    """
    env: dict[str, str] = {}
    warnings: list[str] = []
    for item in items:
        key, sep, value = str(item).partition("=")
        if not check_env_key(key):
            warnings.append(f"{where} {item!r}: expected KEY=VALUE with KEY made of [A-Za-z0-9_]; skipped")
            continue
        if not sep:
            if passthrough is None or key not in passthrough:
                why = "is not set here" if passthrough is not None else "needs =VALUE here"
                warnings.append(f"{where} {key}: {why} (a bare KEY passes this environment's value on); skipped")
                continue
            value = passthrough[key]
        if "\0" in value:
            warnings.append(f"{where} {key}: the value contains a NUL byte; skipped")
            continue
        env[key] = value
    return env, warnings


def parse_host_list(text: str, repeat: int = 1) -> list[Host]:
    """Parse ``"h1,h2"`` (``--hosts``): an entry that is an IP is also that host's IP."""
    if repeat < 1:
        raise HostfileError(f"-n/--repeat-hosts must be > 0, got {repeat}")
    names = text.split(",")
    check_total_ranks(len(names) * repeat, repeat, len(names))
    hosts: list[Host] = []
    for i, name in enumerate(names):
        name = name.strip()
        if not name:
            raise HostfileError(f"--hosts {text!r}: entry {i + 1} is empty")
        check_ssh_name(name, f"--hosts entry {i + 1}")
        host = Host(name, [name] if is_ip(name) else [])
        hosts.extend(Host(host.ssh, list(host.ips)) for _ in range(repeat))
    return hosts


def _parse_rdma(value: Any, where: str) -> list[RdmaEntry]:
    if not isinstance(value, list):
        raise HostfileError(f"{where}: 'rdma' must be a list (null on the diagonal), got {type(value).__name__}")
    out: list[RdmaEntry] = []
    for j, dev in enumerate(value):
        if dev is None or (isinstance(dev, str) and dev):
            out.append(dev)
        elif isinstance(dev, list) and dev and all(isinstance(d, str) and d for d in dev):
            out.append(list(dev))
        else:
            raise HostfileError(f"{where}: rdma[{j}] must be null, a device name or a list of names, "
                            f"got {_short.repr(dev)}")
    return out


def _unknown(data: dict, known: Sequence[str], where: str) -> list[str]:
    """The fields of ``data`` not in ``known`` (ignored, as MLX does); a near miss of a known one is refused."""
    unknown = [key for key in data if key not in known]
    for key in unknown:
        if (meant := typo_of(key, known)) is not None:
            raise HostfileError(f"{where}: unknown field {_short.repr(key)}: did you mean {meant!r}? "
                                f"(the fields are {', '.join(known)}; others are ignored)")
    return unknown


def _parse_host(entry: Any, where: str, ignored: dict[str, list[int]], index: int) -> Host:
    if isinstance(entry, str):  # tolerate a bare name, like --hosts
        entry = {"ssh": entry}
    if not isinstance(entry, dict):
        raise HostfileError(f"{where}: expected an object like {{\"ssh\": \"host1\", \"ips\": [...]}}, "
                            f"got {_short.repr(entry)}")
    for key in _unknown(entry, HOST_FIELDS, where):
        ignored.setdefault(key, []).append(index)
    if "ssh" not in entry:
        raise HostfileError(f"{where}: missing the 'ssh' field (the name to ssh into)")
    name = check_ssh_name(entry["ssh"], f"{where} field 'ssh'")
    ips = entry.get("ips", [])
    if not isinstance(ips, list):
        raise HostfileError(f"{where}: 'ips' must be a list of IP addresses, got {_short.repr(ips)}")
    for j, ip in enumerate(ips):
        if not isinstance(ip, str) or not is_ip(ip):
            raise HostfileError(f"{where}: ips[{j}] = {_short.repr(ip)} is not an IP address")
    return Host(name, list(ips), _parse_rdma(entry.get("rdma", []), where))


def parse_hostfile(data: Any, source: str = "hostfile") -> Hostfile:
    """Build a :class:`Hostfile` from decoded JSON (plain list or object form)."""
    backend: str | None = None
    envs: list[str] = []
    top: list[str] = []
    if isinstance(data, dict):
        top = _unknown(data, TOP_FIELDS, f"{source}: the top level")
        if "hosts" not in data:
            raise HostfileError(f"{source}: the object form needs a 'hosts' list")
        backend = data.get("backend") or None
        if backend is not None and backend not in BACKENDS:
            raise HostfileError(f"{source}: backend {_short.repr(backend)} is not one of {', '.join(BACKENDS)}")
        envs = data.get("envs", [])
        if not isinstance(envs, list) or not all(isinstance(e, str) for e in envs):
            raise HostfileError(f"{source}: 'envs' must be a list of \"KEY=VALUE\" strings")
        data = data["hosts"]
    if not isinstance(data, list):
        raise HostfileError(f"{source}: expected a JSON list of hosts or an object with 'hosts'")
    if not data:
        raise HostfileError(f"{source}: the host list is empty")
    hosts = []
    ignored: dict[str, list[int]] = {}
    for i, h in enumerate(data):
        try:
            hosts.append(_parse_host(h, f"{source}: host {i} (rank {i})", ignored, i))
        except HostfileError as exc:
            exc.entry = i
            raise
    return Hostfile(hosts, backend, list(envs), _ignored_warning(source, top, ignored))


def _ignored_warning(source: str, top: list[str], hosts: dict[str, list[int]]) -> list[str]:
    """One warning naming the unknown fields ignored (at most 8 of them), or none."""
    named = [f"{_short.repr(key)} (top level)" for key in top]
    for key, where in hosts.items():
        which = ", ".join(map(str, where[:4])) + (", ..." if len(where) > 4 else "")
        named.append(f"{_short.repr(key)} (host{'s' if len(where) > 1 else ''} {which})")
    if not named:
        return []
    more = f" and {len(named) - 8} more" if len(named) > 8 else ""
    return [f"{source}: ignored unknown field(s) {', '.join(named[:8])}{more}, as MLX ignores them "
            f"(a hostfile's fields: {', '.join(TOP_FIELDS)}; a host's: {', '.join(HOST_FIELDS)})"]


def _too_deep(data: Any) -> bool:
    """Whether ``data`` nests deeper than MAX_DEPTH (walked without recursion)."""
    stack = [(data, 1)]
    while stack:
        value, level = stack.pop()
        if isinstance(value, (list, dict)):
            if level > MAX_DEPTH:
                return True
            stack.extend((v, level + 1) for v in (value.values() if isinstance(value, dict) else value))
    return False


def decode_json(text: str, source: str = "hostfile") -> Any:
    """The JSON data of a hostfile's text; a HostfileError naming ``source`` (never quoting the text)
    when it is not JSON or nests deeper than any hostfile."""
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise HostfileError(f"{source}: not valid JSON (line {exc.lineno}, column {exc.colno}: {exc.msg})") from None
    except ValueError:   # e.g. an integer longer than Python converts
        raise HostfileError(f"{source}: not valid JSON (a number too long to read)") from None
    except RecursionError:   # deeper than the JSON parser goes
        raise HostfileError(f"{source}: not a hostfile (nested deeper than {MAX_DEPTH} levels)") from None
    if _too_deep(data):
        raise HostfileError(f"{source}: not a hostfile (nested deeper than {MAX_DEPTH} levels)")
    return data


def loads_hostfile(text: str, source: str = "hostfile") -> Hostfile:
    """Parse hostfile JSON text."""
    return parse_hostfile(decode_json(text, source), source)


def read_hostfile(path: str | Path, timeout: float | None = None) -> Hostfile:
    """Read and parse a hostfile from disk, as every entry point does: a regular file of at most
    1 MiB, read within ``timeout`` seconds (default :data:`mlx_jupyter.safe_read.READ_TIMEOUT`)."""
    from mlx_jupyter import safe_read

    source = f"hostfile {str(path)!r}"
    try:
        text = safe_read.read_text(str(path), source, safe_read.READ_TIMEOUT if timeout is None else timeout)
    except safe_read.FileRefused as exc:
        raise HostfileError(str(exc)) from None
    return loads_hostfile(text, source)


def hostfile_path(hosts: Any) -> str | None:
    """The path ``hosts`` names when it is a hostfile, else None: a Path, or text with a "/" or
    ending in ".json" (no host name has either). Never what happens to exist in the cwd: a file
    named like a host must not turn that host into a hostfile."""
    if isinstance(hosts, Path):
        return str(hosts)
    if isinstance(hosts, str) and ("/" in hosts or hosts.lower().endswith(".json")):
        return hosts
    return None


@dataclass
class LaunchSettings:
    """A launch's backend and env after a hostfile's and the explicit ones are merged."""

    backend: str
    env: dict[str, str]
    notices: list[str] = field(default_factory=list)


def refuse_launcher_variables(env: Mapping[str, str], where: str) -> None:
    """A :class:`HostfileError` naming ``where`` and the first variable of ``env`` that the launcher sets."""
    for key in env:
        why = rank_env.LAUNCHER_SETS.get(key)
        if why is not None:
            raise HostfileError(f"{where} {key}: the launcher sets it for each rank ({why}); drop it")


def merge_settings(hostfile: Hostfile | None, source: str, backend: str | None = None,
                   env: Mapping[str, str] | None = None, env_source: str = "--env") -> LaunchSettings:
    """The one rule for every entry point: the hostfile's backend and envs, under the explicit ones;
    with no backend from either, :func:`default_backend`.

    Each explicit value that replaces a different one from the file gives a notice naming both. A variable
    the launcher sets itself (``rank_env.LAUNCHER_SETS``) is refused, naming ``env_source`` or the file.
    """
    explicit = dict(env or {})
    refuse_launcher_variables(explicit, env_source)
    if hostfile is None:
        return LaunchSettings(backend or default_backend(), explicit)
    merged, notices = parse_env(hostfile.envs, f"{source} envs")
    refuse_launcher_variables(merged, f"{source} envs")
    notices[:0] = hostfile.warnings
    if backend and hostfile.backend and backend != hostfile.backend:
        notices.append(f"{source} says backend {hostfile.backend!r}; using {backend!r} as given explicitly")
    for key, value in explicit.items():
        if key in merged and merged[key] != value:
            notices.append(f"{source} sets {key}={merged[key]}; using {key}={value} as given explicitly")
    merged.update(explicit)
    return LaunchSettings(backend or hostfile.backend or default_backend(), merged, notices)


def hostfile_json(data: Any) -> str:
    """The text of a hostfile (either form) from its JSON data: the one way every writer formats it."""
    return json.dumps(data, indent=2) + "\n"


def dumps_hostfile(hostfile: Hostfile | Sequence[Host], form: str = "auto") -> str:
    """JSON text of a hostfile: ``form`` is ``list``, ``object`` or ``auto`` (object when needed)."""
    if not isinstance(hostfile, Hostfile):
        hostfile = Hostfile(list(hostfile))
    hosts = [h.to_json() for h in hostfile.hosts]
    if form == "auto":
        form = "object" if (hostfile.backend or hostfile.envs) else "list"
    if form == "list":
        return hostfile_json(hosts)
    if form != "object":
        raise ValueError(f"form must be 'list', 'object' or 'auto', not {form!r}")
    return hostfile_json({"backend": hostfile.backend or "", "envs": list(hostfile.envs), "hosts": hosts})


def write_hostfile(path: str | Path, hostfile: Hostfile | Sequence[Host], form: str = "auto") -> None:
    """Write a hostfile to ``path``."""
    Path(path).write_text(dumps_hostfile(hostfile, form))


def repeat_hosts(hosts: Sequence[Host], repeat: int) -> list[Host]:
    """Each host ``repeat`` times in a row (``-n``): ranks r*repeat .. on host r."""
    if repeat < 1:
        raise HostfileError(f"-n/--repeat-hosts must be > 0, got {repeat}")
    check_total_ranks(len(hosts) * repeat, repeat, len(hosts))
    return [Host(h.ssh, list(h.ips), list(h.rdma)) for h in hosts for _ in range(repeat)]


def check_total_ranks(total: int, repeat: int, hosts: int) -> None:
    """Refuse a launch of more than ``limits.MAX_RANKS`` ranks, naming the count of hosts and ``-n``."""
    if total > MAX_RANKS:
        raise HostfileError(f"{hosts} hosts with -n {repeat} make {total} ranks: at most {MAX_RANKS} "
                            "ranks in all (fewer hosts, or a smaller -n)")


def resolve_hosts(hosts: Union[str, Path, Sequence[Host], None], repeat: int = 1) -> list[Host]:
    """Accept a host list, a hostfile path or ``"h1,h2"``; return hosts in rank order."""
    if hosts is None:
        return parse_host_list("127.0.0.1", repeat)
    if (path := hostfile_path(hosts)) is not None:
        return repeat_hosts(read_hostfile(path).hosts, repeat)
    if isinstance(hosts, str):
        return parse_host_list(hosts, repeat)
    hosts = list(hosts)
    if not hosts or not all(isinstance(h, Host) for h in hosts):
        raise HostfileError("hosts must be a non-empty list of mlx_jupyter.hostfile.Host")
    for i, h in enumerate(hosts):
        check_ssh_name(h.ssh, f"host {i}")
    return repeat_hosts(hosts, repeat)


def ring_ports(hosts: Sequence[Host], starting_port: int = DEFAULT_STARTING_PORT, connections_per_ip: int = 1) -> list[list[str]]:
    """Ring plan: per rank, the ``ip:port`` it listens on.

    Rank 0's first IP gets ``starting_port``, then +1 per IP per connection,
    rank after rank. Our core also binds every port shifted by
    :func:`~mlx_jupyter.vocab.ports.core_offset`, so choose ``starting_port`` such that both ranges are free.
    """
    if connections_per_ip < 1:
        raise HostfileError(f"--connections-per-ip must be > 0, got {connections_per_ip}")
    port = starting_port
    plan: list[list[str]] = []
    for rank, h in enumerate(hosts):
        if not h.ips:
            raise HostfileError(
                f"rank {rank} on host {h.ssh!r} has no IP: the ring backend needs an IP per rank; "
                "use a hostfile with \"ips\" or list hosts by IP"
            )
        row = []
        for ip in h.ips:
            for _ in range(connections_per_ip):
                row.append(format_addr(ip, port))
                port += 1
        plan.append(row)
    last = port - 1 + CORE_PORT_OFFSET  # (core_offset's -1000 is only ever taken far below 65535)
    if starting_port < 1 or last > 65535:
        raise HostfileError(
            f"--starting-port {starting_port}: the ring needs ports {starting_port}..{port - 1} "
            f"(and +{CORE_PORT_OFFSET} for our core), which leaves 1..65535"
        )
    return plan
