"""The body of a cluster start request, checked whole against a schema before anything runs (pure).

Every refusal is a :class:`RequestError` naming the field and what it takes; it never quotes
what was sent back (the panel shows the message as is).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, Optional

import jsonschema

from mlx_jupyter.vocab import limits, options
from mlx_jupyter.vocab import backends
from mlx_jupyter.vocab.hosts import BOTH_HOST_SOURCES
from mlx_jupyter.hostfile import BACKENDS, HostfileError, check_ssh_name, default_ranks_per_host

#: ranks one start may ask for in all (ranks per host x hosts)
MAX_RANKS = 64
#: the most bytes a start request's body may have
MAX_BODY = 64 * 1024
_NAME_MAX = 255      # a host name (with user@), a path component
_PATH_MAX = 4096

#: the JSON schema of each field the panel offers (the fields: the spec's, mlx_jupyter.vocab.options; each by its
#: Cluster() keyword); an option offered to the panel without a schema here fails at import
_FIELD_SCHEMA: dict[str, Any] = {
    "n": {"type": "integer"},   # its range: limits.count, as for -n on the command line
    "hosts": {"anyOf": [
        {"type": "null"},
        {"type": "string", "maxLength": MAX_RANKS * (_NAME_MAX + 1)},
        {"type": "array", "maxItems": MAX_RANKS, "items": {"type": "string", "minLength": 1, "maxLength": _NAME_MAX}},
    ]},
    "hostfile": {"type": ["string", "null"], "maxLength": _PATH_MAX},
    "backend": {"enum": [*BACKENDS, "", None]},
}
_PANEL = [o.keyword for o in options.on(options.PANEL) if o.keyword is not None]

SCHEMA: dict[str, Any] = {
    "type": "object",
    "additionalProperties": False,
    "properties": {name: _FIELD_SCHEMA[name] for name in _PANEL},
}

#: what each field takes, for the message that names it
FIELDS = {name: {
    "n": f"ranks per host: an integer from 1 to {MAX_RANKS}",
    "hosts": f"host names: a string \"h1,h2\" or a list of names, at most {MAX_RANKS}",
    "hostfile": "the path of a hostfile under the server's root directory, or null",
    "backend": f"one of {', '.join(BACKENDS)}, or null for {backends.DEFAULT_RULE}",
}[name] for name in _PANEL}


class RequestError(ValueError):
    """A request the server refuses (400); ``field`` names the part of the body at fault."""

    def __init__(self, field: str, message: str):
        super().__init__(f"{field}: {message}")
        self.field = field


@dataclass
class StartRequest:
    """A checked start request."""

    n: Optional[int] = None   # None: hostfile.default_ranks_per_host
    hosts: Optional[list[str]] = None
    hostfile: Optional[str] = None
    backend: Optional[str] = None


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not a JSON number")


def parse_start(body: bytes) -> StartRequest:
    """The start request in ``body`` (JSON), or a :class:`RequestError` naming the field at fault."""
    if len(body) > MAX_BODY:
        raise RequestError("body", f"larger than {MAX_BODY // 1024} KiB")
    try:
        data = json.loads(body or b"{}", parse_constant=_no_constant)
    except (ValueError, RecursionError) as exc:   # RecursionError: nesting deeper than the parser goes
        where = f" (line {exc.lineno}, column {exc.colno})" if isinstance(exc, json.JSONDecodeError) else ""
        raise RequestError("body", f"not valid JSON{where}") from None
    if not isinstance(data, dict):
        raise RequestError("body", "must be a JSON object with the fields " + ", ".join(FIELDS))
    error = jsonschema.exceptions.best_match(jsonschema.Draft7Validator(SCHEMA).iter_errors(data))
    if error is not None:
        if error.validator == "additionalProperties":
            unknown = sorted(set(data) - set(FIELDS))
            raise RequestError(str(unknown[0])[:64], "not a field of a start request (they are: "
                               + ", ".join(FIELDS) + ")")
        field = str(error.absolute_path[0]) if error.absolute_path else "body"
        raise RequestError(field, FIELDS.get(field, "not valid"))
    req = StartRequest(_n(data.get("n")), _hosts(data.get("hosts")), data.get("hostfile") or None,
                       data.get("backend") or None)
    if req.hosts and req.hostfile:
        raise RequestError("hostfile", BOTH_HOST_SOURCES)
    check_total(req.n or default_ranks_per_host(bool(req.hosts)), len(req.hosts or [None]), "hosts")
    return req


def _n(value: Any) -> Optional[int]:
    """Ranks per host, checked as every entry point checks ``-n``; None for the default."""
    if value is None:
        return None
    try:
        return limits.count("n", int(value), MAX_RANKS, what="ranks per host")
    except limits.OptionError:
        raise RequestError("n", FIELDS["n"]) from None


def _hosts(value: Any) -> Optional[list[str]]:
    """The host names, each checked; None for none."""
    if not value:
        return None
    names = [h.strip() for h in value.split(",")] if isinstance(value, str) else list(value)
    if len(names) > MAX_RANKS:
        raise RequestError("hosts", FIELDS["hosts"])
    for i, name in enumerate(names):
        try:
            check_ssh_name(name, f"entry {i + 1}")
        except HostfileError:
            raise RequestError("hosts", f"entry {i + 1} is not a host name or address (letters, digits, "
                               "'.', '-', '_', optionally 'user@')") from None
    return names


def check_total(n: int, hosts: int, field: str) -> None:
    """Refuse more than MAX_RANKS ranks in all, naming ``field`` (hosts, or the hostfile)."""
    if n * hosts > MAX_RANKS:
        raise RequestError(field, f"{n} ranks on each of {hosts} hosts is {n * hosts} ranks; "
                                  f"at most {MAX_RANKS} in all")


#: the start form's labels and hints, by field (the panel builds its form from :func:`form_fields`)
_FORM = {
    "n": ("ranks per host", "2"),
    "hosts": ("hosts", "127.0.0.1"),
    "hostfile": ("hostfile", "optional path"),
    "backend": ("backend", ""),
}


def form_fields() -> list[dict[str, Any]]:
    """The start form's fields, from the same schema and limits the request is checked against:
    name, label, kind (number, text, choice), placeholder, help (what it takes: the refusal's words),
    and for ``n`` its range, for ``backend`` its choices ("" for the default: backends.DEFAULT_RULE), for
    ``hostfile`` the field it excludes and why (``excludes``, ``excludes_why``)."""
    out: list[dict[str, Any]] = []
    for name in _PANEL:   # the spec's order; a panel option without a label here fails at once
        label, placeholder = _FORM[name]
        field: dict[str, Any] = {"name": name, "label": label, "placeholder": placeholder, "help": FIELDS[name]}
        if name == "n":
            field.update(kind="number", min=1, max=MAX_RANKS, default=default_ranks_per_host(False))
        elif name == "backend":
            field.update(kind="choice", choices=["", *BACKENDS])
        else:
            field.update(kind="text", maxLength=SCHEMA["properties"]["hostfile"]["maxLength"] if name == "hostfile"
                         else _NAME_MAX * MAX_RANKS)
        if name == "hostfile":   # the form refuses both as the request does, in its words
            field.update(excludes="hosts", excludes_why=BOTH_HOST_SOURCES)
        out.append(field)
    return out
