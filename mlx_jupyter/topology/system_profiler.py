"""Parse `system_profiler SPThunderboltDataType -json`: one entry per Thunderbolt bus of a Mac."""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any

from .commands import SYSTEM_PROFILER, CommandResult, show
from .errors import DiscoveryError

COMMAND = show(SYSTEM_PROFILER)
_SPEED = re.compile(r"(\d+(?:\.\d+)?)\s*Gb/s")
_NUMBER = re.compile(r"[0-9]+")
# The XDomain service a Mac advertises to its peer when RDMA is enabled.
_RDMA_SERVICE_PROTOCOL = 64087


@dataclass(frozen=True)
class Peer:
    """The machine at the far end of a port, as the near end reports it."""

    uuid: str
    name: str | None = None  # marketing name, e.g. "Mac mini"
    model: str | None = None  # model identifier, e.g. "Mac16,11"
    via: tuple[str, ...] = ()  # hubs/docks between the port and the peer
    rdma_service: bool = False


@dataclass(frozen=True)
class Bus:
    """One Thunderbolt bus (= one receptacle) of a Mac."""

    name: str
    uuid: str
    receptacle: str | None
    link_gbps: float | None  # current link speed; None when idle or unknown
    max_gbps: float | None  # the "Up to N Gb/s" an idle port reports
    peers: tuple[Peer, ...]  # every Mac reachable through this bus (more than one only behind a hub)
    machine: str | None = None

    @property
    def peer(self) -> Peer | None:
        return self.peers[0] if self.peers else None


def printable(text: str) -> str:
    """`text` with control characters (terminal escapes, NUL, ...) shown as `?`: remote text reaches terminals."""
    return "".join(ch if ch.isprintable() else "?" for ch in text)


def first_line(text: str, limit: int = 120) -> str:
    """The first non-empty line of `text`, shortened and made printable, for quoting in messages."""
    for line in text.splitlines():
        if line.strip():
            line = printable(line.strip())
            return line if len(line) <= limit else line[: limit - 3] + "..."
    return ""


def parse_speed(text: Any) -> tuple[float | None, float | None]:
    """`"80 Gb/s"` -> (80, None); `"Up to 120 Gb/s"` -> (None, 120); anything else -> (None, None)."""
    if not isinstance(text, str):
        return None, None
    m = _SPEED.search(text)
    if not m:
        return None, None
    value = float(m.group(1))
    return (None, value) if "up to" in text.lower() else (value, None)


def load_json(host: str, command: str, result: CommandResult) -> Any:
    """Decode a command's JSON stdout, or raise a DiscoveryError that says what came back."""
    text = result.stdout
    status = f"exit {result.rc}" + (f": {first_line(result.stderr)}" if first_line(result.stderr) else "")
    if not text.strip():
        raise DiscoveryError(host, command, f"printed nothing ({status})")
    try:
        return json.loads(text)
    except RecursionError:
        raise DiscoveryError(host, command, "printed JSON nested too deeply to read") from None
    except ValueError as exc:
        if text.lstrip()[:1] in ("{", "["):
            problem = f"output is not complete JSON ({exc}; {status})"
        else:
            problem = f"did not print JSON ({status}); it printed: {first_line(text)!r}"
        raise DiscoveryError(host, command, problem) from None


def _peers_of(host: str, bus_name: str, items: Any) -> tuple[Peer, ...]:
    """Every Mac (device with a domain UUID) at any depth of `_items`, depth-first in listed order.

    A Mac directly on the port is the only one; behind a hub or dock there can be several.
    A Mac's own `_items` are not searched: Thunderbolt does not chain through a Mac.
    """
    if items is None:
        return ()
    if not isinstance(items, list):
        raise DiscoveryError(host, COMMAND, f"bus {bus_name}: _items is not a list")
    # stack entries: (item, hubs on the way to it)
    stack: list[tuple[Any, tuple[str, ...]]] = [(it, ()) for it in reversed(items)]
    found: list[Peer] = []
    while stack:
        item, via = stack.pop()
        if not isinstance(item, dict):
            raise DiscoveryError(host, COMMAND, f"bus {bus_name}: an _items entry is not an object")
        uuid = item.get("domain_uuid_key")
        if isinstance(uuid, str) and uuid:
            found.append(Peer(
                uuid=printable(uuid),
                name=_text(item.get("_name")),
                model=_text(item.get("device_name_key")),
                via=via,
                rdma_service=_has_rdma_service(item.get("services_title")),
            ))
            continue
        children = item.get("_items")
        if children is None:
            continue
        if not isinstance(children, list):
            raise DiscoveryError(host, COMMAND, f"bus {bus_name}: _items is not a list")
        hub = _text(item.get("_name")) or _text(item.get("device_name_key")) or "unnamed device"
        stack.extend((child, via + (hub,)) for child in reversed(children))
    return tuple(found)


def _has_rdma_service(services: Any) -> bool:
    if not isinstance(services, list):
        return False
    return any(
        isinstance(s, dict)
        and (s.get("protocol_id_key") == _RDMA_SERVICE_PROTOCOL or s.get("_name") == "unknown_xd_service")
        for s in services
    )


def _text(value: Any) -> str | None:
    return printable(value) if isinstance(value, str) and value else None


def _receptacle(tag: Any) -> str | None:
    if not isinstance(tag, dict):
        return None
    rid = tag.get("receptacle_id_key")
    if isinstance(rid, bool) or not isinstance(rid, (str, int)):
        return None
    rid = str(rid).strip()
    return str(int(rid)) if rid.isascii() and rid.isdigit() else (rid or None)


def parse_system_profiler(host: str, result: CommandResult) -> tuple[list[Bus], list[str]]:
    """The Mac's Thunderbolt buses that have a domain UUID, and warnings about skipped ones."""
    data = load_json(host, COMMAND, result)
    if not isinstance(data, dict):
        raise DiscoveryError(host, COMMAND, "printed JSON that is not an object")
    if "SPThunderboltDataType" not in data:
        raise DiscoveryError(
            host, COMMAND, "output has no SPThunderboltDataType (no Thunderbolt support?)",
            "Thunderbolt discovery needs a Mac with Thunderbolt ports; use --over ethernet otherwise",
        )
    entries = data["SPThunderboltDataType"]
    if not isinstance(entries, list):
        raise DiscoveryError(host, COMMAND, "SPThunderboltDataType is not a list")
    if not entries:
        raise DiscoveryError(
            host, COMMAND, "lists no Thunderbolt buses: this machine reports no Thunderbolt ports",
            "Check the host list, or use --over ethernet",
        )
    buses: list[Bus] = []
    warnings: list[str] = []
    seen: set[str] = set()
    for n, entry in enumerate(entries):
        if not isinstance(entry, dict):
            raise DiscoveryError(host, COMMAND, f"SPThunderboltDataType entry #{n} is not an object")
        uuid = entry.get("domain_uuid_key")
        if not isinstance(uuid, str) or not uuid:
            continue  # not a host bus (MLX skips these too)
        name = _text(entry.get("_name")) or f"bus #{n}"
        uuid = printable(uuid)
        if uuid in seen:
            raise DiscoveryError(host, COMMAND, f"domain UUID {uuid} appears on two buses")
        seen.add(uuid)
        peers = _peers_of(host, name, entry.get("_items"))
        peer = peers[0] if peers else None
        tag = entry.get("receptacle_1_tag")
        receptacle = _receptacle(tag)
        if receptacle is not None and not _NUMBER.fullmatch(receptacle):
            raise DiscoveryError(
                host, COMMAND, f"bus {name}: receptacle_1_tag.receptacle_id_key is {printable(receptacle)!r}, not a number",
            )
        if receptacle is None:
            if peer is not None:
                raise DiscoveryError(
                    host, COMMAND,
                    f"bus {name} is connected to {peer.name or peer.uuid} but has no receptacle_1_tag.receptacle_id_key, "
                    "so its network interface cannot be found",
                )
            warnings.append(f"{host}: `{COMMAND}`: bus {name} has no receptacle_1_tag; skipped (nothing is plugged into it)")
            continue
        link, top = parse_speed(tag.get("current_speed_key") if isinstance(tag, dict) else None)
        buses.append(Bus(name, uuid, receptacle, link, top, peers, _text(entry.get("device_name_key"))))
    return buses, warnings
