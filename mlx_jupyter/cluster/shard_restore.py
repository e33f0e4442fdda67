"""A rank that died gets its own shard of a language model back, from the notebook's side.

A sharded model differs across the ranks, so no peer can give a dead rank its part; but a model
loaded sharded carries its recipe (:mod:`mlx_jupyter.models.shard_recipe`), which the live ranks
report with their save. Names that every live rank holds as such a model, with its weights as
loaded, are left out of the copy from the peers (:mod:`.peer_restore`) and remade on the dead
rank from the folder on its own host, as its own rank's shard (:mod:`.rank.shard_reload`); the
live ranks keep theirs, restored. The restart's line says it: ``rank 1: reloaded its own shard of
model from /models/qwen (tensor parallel, rank 1 of 2) in 0.8 s``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Mapping, Optional, Protocol

from mlx_jupyter.cluster.shared.errors import ClusterError

#: what a rank answered to a step (a dict of what it did), as it came back
Answer = Mapping[str, Any]


class ReloadHost(Protocol):
    """What the reload needs of a keep-state restart (:class:`~.kept_state.KeptState`)."""

    @property
    def saved(self) -> Mapping[int, Answer]: ...
    def _each_rank(self, fn: Callable[..., Any], ranks: list[int], what: str, *args: Any) -> dict[int, Any]: ...


def held(saved: Mapping[int, Answer]) -> set[str]:
    """The names some live rank holds as a sharded model with its recipe: never copied from a peer
    (a peer's shard is not the dead rank's)."""
    return {name for answer in saved.values() for name in (answer.get("shards") or {})}


def choose(saved: Mapping[int, Answer]) -> tuple[list[list[Any]], dict[str, str]]:
    """What a dead rank remakes: ``[names, recipe]`` per model (one model may have several names),
    and the names it cannot remake -> why."""
    per = [saved[r].get("shards") or {} for r in sorted(saved)]
    groups: dict[int, list[Any]] = {}
    lost: dict[str, str] = {}
    for name in sorted(held(saved)):
        recipes: list[Answer] = [p[name] for p in per if name in p]
        first = recipes[0]
        unmade = next((r["unmade"] for r in recipes if r.get("unmade")), "")
        if unmade:
            lost[name] = str(unmade)
        elif len(recipes) < len(per):
            lost[name] = "a sharded model on some live ranks only: load it again on every rank"
        elif any(r["changed"] for r in recipes):
            lost[name] = (f"its weights changed since they were loaded from {first['path']}, so the folder "
                          "cannot remake this rank's shard: load it again on every rank")
        elif len({(r["path"], r["tensor"], r["pipeline"], r["size"]) for r in recipes}) != 1:
            lost[name] = "the live ranks' shards of it are of different models: load it again on every rank"
        else:
            groups.setdefault(int(first["key"]), [[], {k: v for k, v in first.items() if k != "key"}])[0].append(name)
    return list(groups.values()), lost


@dataclass
class ShardReload:
    """What the dead ranks remade: rank -> one entry per model (:func:`.rank.shard_reload.reload`)."""

    lost: dict[str, str] = field(default_factory=dict)            # names no dead rank could remake -> why
    answers: dict[int, list[Answer]] = field(default_factory=dict)
    errors: dict[int, str] = field(default_factory=dict)          # dead rank -> why its step failed
    names: list[str] = field(default_factory=list)                # the names asked for

    def reloaded(self, rank: int) -> list[str]:
        """The names dead rank ``rank`` got back from its own shard's folder."""
        return [n for e in self.answers.get(rank, []) if "seconds" in e for n in e["names"]]

    def origins(self, origins: dict[int, str]) -> dict[int, str]:
        """``origins`` (rank -> where its names came from), with each dead rank's reloaded shard."""
        out = dict(origins)
        for r in self.answers:
            names = self.reloaded(r)
            if names:
                before = out.get(r, "empty")
                own = f"its own shard reloaded from the folder ({', '.join(names)})"
                out[r] = own if before == "empty" else f"{before} and {own}"
        return out

    def clauses(self, rank: int, host: str, back: Optional[list[str]] = None) -> list[str]:
        """The restart line's words for dead rank ``rank`` (on ``host``); ``back``: names its own
        per-cell record gave back, which are not lost."""
        words = []
        for e in self.answers.get(rank, []):
            names, path = ", ".join(e["names"]), e["path"]
            if "seconds" in e:
                took = f"{e['seconds']:.1f}" if e["seconds"] >= 0.1 else f"{e['seconds']:.2f}"
                words.append(f"rank {rank}: reloaded its own shard of {names} from {path} ({e['words']}) in {took} s")
            elif not set(e["names"]) <= set(back or []):
                why = (f"{path} is not a model folder on {host}: copy the folder there, at the same path, then "
                       "load the model again on every rank" if e.get("missing") else f"{path}: {e.get('error')}")
                words.append(f"rank {rank}: could not reload its own shard of {names} ({why})")
        if rank in self.errors and not set(self.names) <= set(back or []):
            words.append(f"rank {rank}: could not reload its own shard of {', '.join(self.names)} "
                         f"({self.errors[rank]})")
        words += [f"rank {rank}: lost {n} ({why})" for n, why in sorted(self.lost.items()) if n not in (back or [])]
        return words


def reload_dead(state: ReloadHost, dead: list[int]) -> Optional[ShardReload]:
    """Each of ``dead`` (new processes, MLX's new world formed) remakes its own shard of every model
    the live ranks hold with their recipe; None when they hold none."""
    from mlx_jupyter.cluster.rank import shard_reload

    if not held(state.saved) or not dead:
        return None
    groups, lost = choose(state.saved)
    result = ShardReload(lost=lost, names=sorted(n for names, _ in groups for n in names))
    if not groups:
        return result
    answers = state._each_rank(shard_reload.reload, dead, "reloading a dead rank's own shard", groups)
    for r, answer in answers.items():
        if isinstance(answer, ClusterError):
            result.errors[r] = (str(answer).strip().splitlines() or ["it failed"])[0]
        else:
            result.answers[r] = list(answer)
    return result
