"""A rank that died, given back what its live peers hold alike, from the rank side: each live rank
saves its names with a digest per name (:func:`save_digested`), and the dead rank's new process
binds the chosen names from one peer's saved files on its own host (:func:`restore_from`): the
files are in shared memory (or the temp dir), mapped and read in place, never sent through the
notebook. The peer's files stay for the peer's own restore, which removes them. A dead rank with
no live peer on its host gets the files straight from a peer on another host (:func:`serve`,
:func:`fetch_from`: one TCP connection between the two ranks, both proving the restart's secret,
:mod:`.peer_wire`).
"""

from __future__ import annotations

import mmap
import os
import pickle
import shutil
import socket
from pathlib import Path
from typing import Any, MutableMapping, Optional

from mlx_jupyter.cluster.rank import keep
from mlx_jupyter.cluster.rank.keep_files import keep_dir, private_dir, rank_folder
from mlx_jupyter.cluster.rank.keep_write import remove_quietly
from mlx_jupyter.cluster.rank.rank_taint import rank_dependent

#: what a copy fetched over the network leaves free where it is written (as a save does)
ROOM_MARGIN = 64 << 20


def save_digested(dirname: str, rank: int) -> dict[str, Any]:
    """:func:`keep.save`, with each name's digest (``"digests"``) to compare across the live ranks,
    and the names this rank's cells computed from its rank number (``"from_rank"``): with one live
    rank, nothing to compare with, those are what the dead rank must not get; and the models that
    carry their recipe (``"shards"``, :mod:`.shard_reload`), which it remakes from their folder."""
    from mlx_jupyter.cluster.rank.shard_reload import found

    answer = keep.save(dirname, rank, digests=True)
    history = keep._user_ns().get("In", [])
    answer["from_rank"] = rank_dependent([c for c in history if isinstance(c, str)])
    answer["shards"] = found(keep._user_ns())   # models that carry their recipe: a dead rank remakes its own
    return answer


def restore_from(dirname: str, peer: int, names: list[str], ns: Optional[MutableMapping[str, Any]] = None,
                 stem: str = "rank") -> dict[str, Any]:
    """Bind ``names`` (and every import) that rank ``peer`` saved on this host into this rank's
    namespace; what came back and what did not (the peer's files are left in place). ``stem``:
    "copy" for the files :func:`fetch_from` brought from another host."""
    if ns is None:
        ns = keep._user_ns()
    folder = private_dir(rank_folder(dirname, peer) if stem == "rank" else keep_dir(dirname), create=False)
    index_path, data_path = folder / f"{stem}{peer}.index", folder / f"{stem}{peer}.data"
    if not index_path.exists():
        raise FileNotFoundError(f"rank {peer}'s saved names are not on this host ({folder})")
    with open(index_path, "rb") as f:
        index = pickle.load(f)
    back = keep.import_modules(index["modules"], ns, overwrite=True)
    wanted = [n for n in names if n not in index["modules"]]
    restored, failed = [], dict(back["failed"])
    mapped = None
    if data_path.stat().st_size:
        with open(data_path, "rb") as f:
            mapped = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_COPY)
    view = memoryview(mapped) if mapped is not None else memoryview(b"")
    keep._TARGET["ns"] = ns
    before = dict(ns)
    try:
        values = _whole(index, view, wanted)
        if values is not None and all(n in values for n in wanted):
            # all names from one pickle: what they share stays shared (a step function and its optimizer)
            for name in wanted:
                ns[name] = values[name]
            restored.extend(wanted)
        else:
            records = {name: (payload, spans) for name, payload, spans in index["records"]}
            for name in wanted:
                if name not in records:
                    failed[name] = f"rank {peer} did not save it"
                    continue
                payload, spans = records[name]
                try:
                    ns[name] = pickle.loads(payload, buffers=[view[o:o + n] for o, n in spans])
                    restored.append(name)
                except Exception as exc:  # noqa: BLE001 - one name's failure costs only that name
                    failed[name] = f"could not be restored: {type(exc).__name__}: {str(exc)[:80]}"
    finally:
        keep._TARGET.pop("ns", None)
        _only(ns, before, set(restored) | set(back["restored"]))
    return {"restored": restored, "imports": back["restored"], "failed": failed, "peer": peer}


def _only(ns: MutableMapping[str, Any], before: dict[str, Any], kept: set[str]) -> None:
    """Undo what unpickling bound besides ``kept``: a function brings the globals it reads, and
    one that reads a name that differs across ranks (a shard) must not leave the peer's value."""
    for name in [n for n in ns if n not in kept and (n not in before or ns[n] is not before[n])]:
        if name in before:
            ns[name] = before[name]
        else:
            del ns[name]


def _whole(index: dict[str, Any], view: memoryview, wanted: Optional[list[str]] = None) -> Optional[dict[str, Any]]:
    """Every name the peer saved, from its one pickle of them all (None if that fails). The MLX
    arrays that only names other than ``wanted`` hold are not copied into MLX (they come back as
    None: those names are dropped), so a dead rank does not pay for its peer's own shard."""
    whole, spans = index["whole"]
    if whole is None:
        return None
    buffers = [view[o:o + n] for o, n in spans]
    if wanted is not None:
        used = {o for name, _, rec in index["records"] if name in wanted for o, _ in rec}
        keep.SKIP.update(keep.buffer_address(b) for (o, n), b in zip(spans, buffers) if n and o not in used)
    try:
        names: dict[str, Any] = pickle.loads(whole, buffers=buffers)
        return names
    except Exception:  # noqa: BLE001 - then name by name
        return None
    finally:
        keep.SKIP.clear()


#: the one-time token's length (bytes) the notebook gives both ranks (never sent between them)
TOKEN_BYTES = 32


def serve(dirname: str, rank: int, token_hex: str, timeout: float = 60.0, toward: str = "") -> dict[str, Any]:
    """Offer this rank's saved files to the one connection that proves it holds ``token_hex``
    under the cluster's secret (another host's new rank, :func:`fetch_from`), for ``timeout`` s;
    its address, ``{"host", "port"}``: this rank's ring address, else the one on its route to
    ``toward`` (the fetching rank's host: loopback when that is this host), never every interface."""
    from mlx_jupyter.cluster.rank import peer_serve

    folder = private_dir(rank_folder(dirname, rank), create=False)
    paths = [folder / f"rank{rank}.index", folder / f"rank{rank}.data"]
    candidates, why = [_ring_address(rank)], "no ring hostfile"
    if toward:
        try:
            candidates.append(peer_serve.route_address(toward))
        except OSError as exc:
            why += f", and {exc}"
    if not any(candidates):
        raise OSError(f"rank {rank} cannot tell which of its interfaces the fetching rank reaches ({why}): "
                      "its names are not offered on every interface")
    server = peer_serve.listen(candidates)
    host, port = server.getsockname()[:2]
    peer_serve.Offer(server, _copy_key(token_hex), paths, timeout).start()
    return {"host": host, "port": port}


def _copy_key(token_hex: str) -> bytes:
    """The peer copy's key: the notebook's one-time token under the engines' session key (the
    cluster's secret, which the controller's traffic does not carry)."""
    from mlx_jupyter.cluster.rank import agent as _agent
    from mlx_jupyter.cluster.rank.peer_wire import copy_key

    kernel = getattr(_agent.AGENT, "kernel", None)
    cluster_key = getattr(getattr(kernel, "session", None), "key", b"") or b""
    return copy_key(bytes.fromhex(token_hex), bytes(cluster_key))


def _ring_address(rank: int) -> str:
    """This rank's address as the other ranks dial it (MLX's ring hostfile), or "" if unknown."""
    try:
        from mlx_jupyter.cluster.rank.peers import ring_rows
        from mlx_jupyter.cluster.rank.world import this_rank_env

        rows = ring_rows(this_rank_env().mlx_hostfile)
        return rows[rank][0] if rank < len(rows) else ""
    except Exception:  # noqa: BLE001 - no ring hostfile: the route toward the fetcher
        return ""


def fetch_from(dirname: str, peer: int, host: str, port: int, token_hex: str, names: list[str],
               timeout: float = 60.0) -> dict[str, Any]:
    """Bring rank ``peer``'s saved files from its host (:func:`serve`) into this host's keep folder,
    bind ``names`` from them (:func:`restore_from`), and remove the copy. The server proves the
    secret first; its header's sizes are capped by the room here and all it sent is checked
    against its digest before anything is unpickled (:mod:`.peer_wire`)."""
    from mlx_jupyter.cluster.rank import peer_wire

    folder = private_dir(keep_dir(dirname), create=True)
    paths = [folder / f"copy{peer}.index", folder / f"copy{peer}.data"]
    room = max(0, shutil.disk_usage(folder).free - ROOM_MARGIN)
    where = f"the room in {folder.parent} less {ROOM_MARGIN >> 20} MiB"
    try:
        with socket.create_connection((host, port), timeout) as conn:
            digest = peer_wire.dial(conn, _copy_key(token_hex), f"rank {peer}'s offer at {host}:{port}")
            sizes = peer_wire.read_header(conn, digest, room, where)
            peer_wire.receive_files(conn, digest, paths, sizes,
                                    lambda: f"rank {peer}'s host closed the connection early")
        answer = restore_from(dirname, peer, names, stem="copy")
        answer["over"] = "network"
        return answer
    finally:
        remove_quietly(list(paths), folder)
