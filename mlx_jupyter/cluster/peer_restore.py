"""A rank that died comes back with what its live peers hold alike, from the notebook's side.

At a keep-state restart after a rank died, each live rank saves its names with a digest per name
(:func:`mlx_jupyter.cluster.rank.peer_copy.save_digested`); the names every live rank holds with
the same digest (equal bytes for arrays, equal pickles for the rest) are bound on the dead rank's
new process from one live peer's saved files on the same host (shared memory), before the peer
restores its own; a dead rank with no live peer on its host fetches them from one on another host,
straight from that rank. The notebook only compares digests and names the peer: no data passes through it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Hashable, Mapping, Optional, Protocol

from mlx_jupyter.cluster.channel_calls import Plan
from mlx_jupyter.vocab.hosts import is_local

#: how many names a report line lists before "…"
SHOWN = 6

#: what a rank answered to a step (a dict of what it did), as it came back
Answer = Mapping[str, Any]


class SavedState(Protocol):
    """What the dead ranks' copy needs of a keep-state restart (:class:`~.kept_state.KeptState`): what
    the live ranks saved, where, and a step on some ranks (rank -> answer, or the exception for it)."""

    @property
    def saved(self) -> Mapping[int, Answer]: ...
    @property
    def dirname(self) -> str: ...
    @property
    def timeout(self) -> float: ...
    def _each_rank(self, fn: Callable[..., Any], ranks: list[int], what: str, *args: Any) -> dict[int, Any]: ...


def alike(saved: Mapping[int, Answer]) -> tuple[list[str], list[str]]:
    """The names every live rank saved with one digest, and those that differ (or some rank lacks)."""
    digests: list[Mapping[str, Hashable]] = []
    for answer in saved.values():
        digest = answer.get("digests")
        if digest is None:
            return [], []
        digests.append(digest)
    if not digests:
        return [], []
    names: set[str] = set().union(*digests)
    same = sorted(n for n in names if all(n in d for d in digests) and len({d[n] for d in digests}) == 1)
    return same, sorted(names - set(same))


def same_host(a: Optional[str], b: Optional[str]) -> bool:
    """Whether two ranks' hosts (as reached) are one machine."""
    if a is None or b is None:
        return False
    return a == b or (is_local(a) and is_local(b))


def choose_peer(rank: int, live: list[int], hosts: dict[int, str]) -> Optional[int]:
    """The live rank whose saved files ``rank``'s new process can read: the lowest on its host."""
    return next((p for p in sorted(live) if same_host(hosts.get(p), hosts.get(rank))), None)


@dataclass
class PeerCopy:
    """What the dead ranks got from their peers: rank -> the peer's answer (restored, failed, peer)."""

    got: dict[int, Answer] = field(default_factory=dict)
    no_peer: list[int] = field(default_factory=list)      # dead ranks with no live rank at all
    differ: list[str] = field(default_factory=list)       # names not alike across the live ranks
    errors: dict[int, str] = field(default_factory=dict)  # dead rank -> why its copy failed
    live: int = 0                                          # how many live ranks were compared
    guessed: list[str] = field(default_factory=list)      # one live rank: names its cells computed from its rank

    def note(self, answers: Mapping[int, Any]) -> None:
        """Keep each dead rank's answer, or why it got nothing."""
        from mlx_jupyter.cluster.shared.errors import ClusterError

        for r, answer in answers.items():
            if isinstance(answer, ClusterError):
                self.errors[r] = str(answer)
            else:
                self.got[r] = answer

    def clause(self, rank: int, own: Optional[Answer] = None) -> str:
        """The report's words for dead rank ``rank`` (one that got names from a peer); ``own``: what
        its own per-cell record gave back besides (:func:`mlx_jupyter.cluster.rank.state_record.restore`)."""
        got = self.got[rank]
        names = [n for n in got.get("restored", [])]
        shown = ", ".join(names[:SHOWN]) + (", …" if len(names) > SHOWN else "")
        if names:
            text = f"rank {rank} died: {len(names)} name{'' if len(names) == 1 else 's'}"
            text += f" restored from rank {got['peer']}"
            text += " over the network" if got.get("over") == "network" else ""
            text += f" ({shown})" + (" and its imports" if got.get("imports") else "")
        else:
            text = f"rank {rank} died: {'its imports' if got.get('imports') else 'nothing'} restored from rank {got['peer']}"
            text += " over the network" if got.get("over") == "network" else ""
        if self.live == 1:
            text += (f" (rank {got['peer']} was the only live rank, nothing to compare with: every name its cells "
                     "did not compute from the rank's number or process was copied)")
        back = set((own or {}).get("restored", []))
        if back:
            text += f"; {_own_words(own or {}, short=True)}"
        lost = _tagged([n for n in self.differ if n not in back], "they differ across ranks", "it differs across ranks")
        lost += _tagged([n for n in self.guessed if n not in back], "computed from the rank's number or process")
        lost += [f"{n} ({why})" for n, why in sorted({**got.get("failed", {}), **(own or {}).get("failed", {})}.items())
                 if n not in back]
        return text + (f"; lost: {', '.join(lost)}" if lost else "")

    def origins(self, ranks: list[int], own: list[int], records: Optional[Mapping[int, Answer]] = None) -> dict[int, str]:
        """Rank -> where its names came from at this restart (for ``%mlx_cluster status``): its own
        saved names, a peer, its own per-cell record (``records``: dead rank -> what it gave), or none."""
        out: dict[int, str] = {}
        for r in ranks:
            rec = (records or {}).get(r, {})
            n_rec = len(rec.get("restored", []))
            from_record = f"its own record of cell {rec.get('cell')} ({n_rec} name{'' if n_rec == 1 else 's'})"
            if r in self.got:
                n = len(self.got[r].get("restored", []))
                out[r] = f"from rank {self.got[r]['peer']} ({n} name{'' if n == 1 else 's'})"
                out[r] += f" and {from_record}" if n_rec else ""
            elif r in own:
                out[r] = "its own names"
            elif rec:
                out[r] = f"from {from_record}"
            else:
                out[r] = "empty"
        return out


def _own_words(own: Answer, short: bool = False) -> str:
    """What a dead rank's own record gave back: ``2 from its own record of cell 7 (shard, r)``."""
    names = list(own.get("restored", []))
    shown = ", ".join(names[:SHOWN]) + (", …" if len(names) > SHOWN else "")
    count = f"{len(names)}" if short else f"{len(names)} name{'' if len(names) == 1 else 's'} restored"
    return f"{count} from its own record of cell {own.get('cell')} ({shown})"


def own_clause(rank: int, own: Answer) -> str:
    """The report's words for a dead rank whose names came from its own record only (no live peer)."""
    if own.get("restored"):
        text = f"rank {rank} died: {_own_words(own)}"
        text += " and its imports" if own.get("imports") else ""
    else:
        text = f"rank {rank} died: its imports restored from its own record of cell {own.get('cell')}"
    failed = [f"{n} ({why})" for n, why in sorted(own.get("failed", {}).items())]
    return text + (f"; lost: {', '.join(failed)}" if failed else "")


def _tagged(names: list[str], why: str, why_one: Optional[str] = None) -> list[str]:
    """``names`` for the report, the last followed by ``(why)``."""
    if not names:
        return []
    return names[:-1] + [f"{names[-1]} ({why_one if len(names) == 1 and why_one else why})"]


def plan_dead(state: SavedState, dead: list[int], hosts: dict[int, str]) -> tuple[PeerCopy, Plan]:
    """What each of ``dead`` (new processes) gets from its live peers: the names they hold alike,
    from one live peer on its host. The copies from a peer on another host are made here (over the
    network); the same-host ones come back as a plan (rank -> (function, args)) that the restart runs
    beside the live ranks' own restore, which then leaves the peer's files in place."""
    from mlx_jupyter.cluster.rank import peer_copy

    from mlx_jupyter.cluster.shard_restore import held

    live = sorted(state.saved)
    same, differ = alike(state.saved)
    shards = held(state.saved)   # a sharded model: the dead rank remakes its own (shard_restore), never a peer's
    same, differ = [n for n in same if n not in shards], [n for n in differ if n not in shards]
    guessed: list[str] = []
    if len(live) == 1:   # nothing to compare with: leave out what its cells computed from its rank number
        guessed = sorted(set(state.saved[live[0]].get("from_rank", [])) & set(same))
        same = [n for n in same if n not in guessed]
    result = PeerCopy(differ=differ, live=len(live), guessed=guessed)
    plan: Plan = {}
    for r in dead:
        peer = choose_peer(r, live, hosts)
        if peer is None:
            result.no_peer.append(r)
        else:
            plan[r] = (peer_copy.restore_from, [state.dirname, peer, same])
    for r in list(result.no_peer) if live else []:   # its peers are on other hosts: over the network
        result.no_peer.remove(r)
        result.note(_over_network(state, r, live[0], hosts, same))
    return result, plan


def _over_network(state: SavedState, rank: int, peer: int, hosts: dict[int, str], names: list[str]) -> dict[int, Any]:
    """Dead rank ``rank`` fetches ``peer``'s saved files from the peer's host straight from the peer
    (one connection on which both prove a one-time token under the cluster's secret), then binds
    ``names``; rank -> its answer."""
    import secrets

    from mlx_jupyter.cluster.rank import peer_copy
    from mlx_jupyter.cluster.shared.errors import ClusterError

    token = secrets.token_hex(peer_copy.TOKEN_BYTES)
    offer = state._each_rank(peer_copy.serve, [peer], "offering a rank's saved names to a dead rank",
                             state.dirname, peer, token, state.timeout,
                             _toward(hosts.get(rank, ""), hosts.get(peer, "")))[peer]
    if isinstance(offer, ClusterError):
        return {rank: ClusterError(f"rank {peer} could not offer its names: {offer}")}
    host = offer.get("host") or hosts.get(peer, "")
    return state._each_rank(peer_copy.fetch_from, [rank], "copying a rank's saved names from another host",
                            state.dirname, peer, host, offer["port"], token, names, state.timeout)


def _toward(fetcher: str, server: str) -> str:
    """The fetching rank's host as the serving rank can route to it: the notebook's name for it,
    or, when that is this machine's own (``localhost``), this machine's address on its route to
    the server's host ("" if none)."""
    if not fetcher or not is_local(fetcher) or not server or is_local(server):
        return fetcher
    from mlx_jupyter.cluster.rank.peer_serve import route_address

    try:
        return route_address(server)
    except OSError:
        return ""
