"""A rank that died, given back what its live peers hold alike, from the rank side: each live rank
saves its names with a digest per name (:func:`save_digested`), and the dead rank's new process
binds the chosen names from one peer's saved files on its own host (:func:`restore_from`): the
files are in shared memory (or the temp dir), mapped and read in place, never sent through the
notebook. The peer's files stay for the peer's own restore, which removes them. A dead rank with
no live peer on its host gets the files straight from a peer on another host (:func:`serve`,
:func:`fetch_from`: one TCP connection between the two ranks, opened with a one-time token).
"""

from __future__ import annotations

import ast
import hmac
import mmap
import os
import pickle
import socket
import struct
import threading
from pathlib import Path
from typing import Any, MutableMapping, Optional

from mlx_jupyter.cluster.rank import keep
from mlx_jupyter.cluster.rank.keep_files import keep_dir, private_dir, rank_folder


def save_digested(dirname: str, rank: int) -> dict[str, Any]:
    """:func:`keep.save`, with each name's digest (``"digests"``) to compare across the live ranks,
    and the names this rank's cells computed from its rank number (``"from_rank"``): with one live
    rank, nothing to compare with, those are what the dead rank must not get."""
    answer = keep.save(dirname, rank, digests=True)
    history = keep._user_ns().get("In", [])
    answer["from_rank"] = rank_dependent([c for c in history if isinstance(c, str)])
    return answer


#: strings that name a rank's number in its environment
_RANK_VARS = frozenset({"MLX_RANK", "RANK", "LOCAL_RANK", "OMPI_COMM_WORLD_RANK", "PMI_RANK", "SLURM_PROCID"})


#: the methods that put a value into a list, set or deque
_FILLS = frozenset({"append", "extend", "insert", "add", "appendleft", "extendleft"})


def rank_dependent(sources: list[str]) -> list[str]:
    """The global names cells assigned from the rank's number (``world.rank()``, ``MLX_RANK``) or
    from a name so assigned (``Xs = X[r::n]``, then ``loss = f(Xs)``), in cell order."""
    tainted: set[str] = set()
    for src in sources:
        try:
            tree = ast.parse(src)
        except (SyntaxError, ValueError):
            continue
        for stmt in _module_level(tree.body):
            if isinstance(stmt, (ast.Assign, ast.AugAssign, ast.AnnAssign)) and stmt.value is not None:
                if _depends(stmt.value, tainted):
                    for target in (stmt.targets if isinstance(stmt, ast.Assign) else [stmt.target]):
                        tainted |= _bound(target)
            elif isinstance(stmt, ast.Expr) and isinstance(stmt.value, ast.Call):
                call = stmt.value   # losses.append(f(r)): the list now holds the rank's data (opt.update(g) does
                # not make the optimizer the rank's: its gradients were averaged, which no parse can tell)
                if isinstance(call.func, ast.Attribute) and call.func.attr in _FILLS \
                        and _depends(call, tainted, skip=call.func):
                    tainted |= _bound(call.func.value)
    return sorted(tainted)


def _module_level(body: list[ast.stmt]) -> list[ast.stmt]:
    """A cell's statements that bind globals: its own and those in its loops, ifs, withs and trys."""
    out: list[ast.stmt] = []
    for stmt in body:
        out.append(stmt)
        if isinstance(stmt, (ast.For, ast.AsyncFor, ast.While, ast.If, ast.With, ast.AsyncWith, ast.Try)):
            for block in ("body", "orelse", "finalbody"):
                out.extend(_module_level(getattr(stmt, block, []) or []))
            for handler in getattr(stmt, "handlers", []) or []:
                out.extend(_module_level(handler.body))
    return out


def _depends(expr: ast.AST, tainted: set[str], skip: Optional[ast.AST] = None) -> bool:
    for node in ast.walk(expr):
        if node is skip:
            continue
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "rank":
            return True
        if isinstance(node, ast.Name) and node.id in tainted:
            return True
        if isinstance(node, ast.Constant) and node.value in _RANK_VARS:
            return True
    return False


def _bound(target: ast.AST) -> set[str]:
    """The global names an assignment target binds or changes (``a, b``, ``d[k]``, ``obj.x``)."""
    if isinstance(target, ast.Name):
        return {target.id}
    if isinstance(target, (ast.Tuple, ast.List)):
        return set().union(*(_bound(t) for t in target.elts)) if target.elts else set()
    if isinstance(target, ast.Starred):
        return _bound(target.value)
    if isinstance(target, (ast.Subscript, ast.Attribute)):
        return _bound(target.value)
    return set()


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


#: the one-time token's length (bytes) a fetching rank sends first
TOKEN_BYTES = 32
_HEADER = struct.Struct("!QQ")


def serve(dirname: str, rank: int, token_hex: str, timeout: float = 60.0) -> dict[str, Any]:
    """Offer this rank's saved files to one connection that first sends ``token_hex``'s bytes
    (another host's new rank, :func:`fetch_from`); its address: ``{"host", "port"}``."""
    folder = private_dir(rank_folder(dirname, rank), create=False)
    paths = [folder / f"rank{rank}.index", folder / f"rank{rank}.data"]
    token = bytes.fromhex(token_hex)
    host = _ring_address(rank)
    try:
        server = socket.create_server((host, 0)) if host else None
    except OSError:
        server = None
    server = server or socket.create_server(("", 0))
    server.settimeout(timeout)
    threading.Thread(target=_send_once, args=(server, token, paths, timeout), name="mlx-peer-copy",
                     daemon=True).start()
    return {"host": host, "port": server.getsockname()[1]}


def _ring_address(rank: int) -> str:
    """This rank's address as the other ranks dial it (MLX's ring hostfile), or "" if unknown."""
    try:
        from mlx_jupyter.cluster.rank.peers import ring_rows
        from mlx_jupyter.cluster.rank.world import this_rank_env

        rows = ring_rows(this_rank_env().mlx_hostfile)
        return rows[rank][0] if rank < len(rows) else ""
    except Exception:  # noqa: BLE001 - no ring hostfile: the notebook's name for the host
        return ""


def _send_once(server: socket.socket, token: bytes, paths: list[Path], timeout: float) -> None:
    """Accept until the connection with the token (or the timeout); send it the two files."""
    with server:
        while True:
            try:
                conn, _ = server.accept()
            except OSError:
                return   # timed out: nobody came
            with conn:
                conn.settimeout(timeout)
                try:
                    if not hmac.compare_digest(_read_exact(conn, len(token)), token):
                        continue
                    sizes = [p.stat().st_size for p in paths]
                    conn.sendall(_HEADER.pack(*sizes))
                    for path in paths:
                        with open(path, "rb") as f:
                            conn.sendfile(f)
                    return
                except OSError:
                    continue


def _read_exact(conn: socket.socket, n: int) -> bytes:
    out = bytearray()
    while len(out) < n:
        chunk = conn.recv(min(n - len(out), 1 << 20))
        if not chunk:
            raise ConnectionError("the peer closed the connection")
        out += chunk
    return bytes(out)


def fetch_from(dirname: str, peer: int, host: str, port: int, token_hex: str, names: list[str],
               timeout: float = 60.0) -> dict[str, Any]:
    """Bring rank ``peer``'s saved files from its host (:func:`serve`) into this host's keep folder,
    bind ``names`` from them (:func:`restore_from`), and remove the copy."""
    folder = private_dir(keep_dir(dirname), create=True)
    paths = [folder / f"copy{peer}.index", folder / f"copy{peer}.data"]
    try:
        with socket.create_connection((host, port), timeout) as conn:
            conn.sendall(bytes.fromhex(token_hex))
            sizes = _HEADER.unpack(_read_exact(conn, _HEADER.size))
            for path, size in zip(paths, sizes):
                fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
                try:
                    left = size
                    while left:
                        chunk = conn.recv(min(left, 4 << 20))
                        if not chunk:
                            raise ConnectionError(f"rank {peer}'s host closed the connection early")
                        view = memoryview(chunk)
                        while view.nbytes:
                            view = view[os.write(fd, view):]
                        left -= len(chunk)
                finally:
                    os.close(fd)
        answer = restore_from(dirname, peer, names, stem="copy")
        answer["over"] = "network"
        return answer
    finally:
        for path in paths:
            try:
                path.unlink()
            except FileNotFoundError:
                pass
        try:
            folder.rmdir()
        except OSError:
            pass
