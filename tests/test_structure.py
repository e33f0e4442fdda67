"""The package's shape: every module imports, no two modules import each other, even indirectly, and no
layer imports one above it (docs/architecture.md, "Layers")."""

from __future__ import annotations

import ast
import importlib
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parent.parent / "mlx_jupyter"


def module_names() -> dict[str, Path]:
    """Dotted name -> file, for every module of the package."""
    out = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        out[".".join(parts)] = path
    return out


def imports_of(name: str, path: Path, known: set[str]) -> set[str]:
    """The package's modules that ``name`` imports anywhere in its file (also inside functions and
    ``TYPE_CHECKING`` blocks: a deferred import still ties the two modules together)."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")
                anchor = anchor[: len(anchor) - (node.level - 1)]
                base = ".".join(anchor + ([base] if base else []))
            for alias in node.names:
                found.add(f"{base}.{alias.name}" if f"{base}.{alias.name}" in known else base)
    return {m for m in found if m in known and m != name}


def cycle(graph: dict[str, set[str]]) -> list[str]:
    """One import cycle in ``graph`` (``[]``: none)."""
    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(node: str) -> list[str]:
        state[node] = 1
        stack.append(node)
        for nxt in sorted(graph[node]):
            if state.get(nxt) == 1:
                return stack[stack.index(nxt):] + [nxt]
            if nxt not in state:
                found = visit(nxt)
                if found:
                    return found
        state[node] = 2
        stack.pop()
        return []

    for node in sorted(graph):
        if node not in state:
            found = visit(node)
            if found:
                return found
    return []


def test_no_import_cycles() -> None:
    modules = module_names()
    graph = {name: imports_of(name, path, set(modules)) for name, path in modules.items()}
    assert cycle(graph) == []


RANK_SIDE = "mlx_jupyter.cluster.rank"
SHARED = "mlx_jupyter.cluster.shared"


def side(module: str) -> str:
    """Which side of the cluster a module is on: rank, shared (both sides import it), notebook, or outside."""
    for prefix, name in ((RANK_SIDE, "rank"), (SHARED, "shared")):
        if module == prefix or module.startswith(prefix + "."):
            return name
    if module.startswith("mlx_jupyter.cluster."):
        return "notebook"
    return "outside"


def test_each_side_of_the_cluster_imports_only_what_it_may() -> None:
    """A rank's engine loads only the rank side, the shared protocol and what is outside the cluster;
    the shared protocol imports neither side; the notebook side may name rank-side functions (it
    ships them to the ranks)."""
    allowed = {"rank": {"rank", "shared", "outside"}, "shared": {"shared", "outside"}}
    modules = module_names()
    wrong = []
    for name, path in modules.items():
        mine = side(name)
        for imported in imports_of(name, path, set(modules)):
            if imported != "mlx_jupyter.cluster" and side(imported) not in allowed.get(mine, {side(imported)}):
                wrong.append(f"{name} ({mine}) imports {imported} ({side(imported)})")
    assert wrong == []
    assert {side(n) for n in modules} >= {"rank", "shared", "notebook"}


VOCAB = "mlx_jupyter.vocab"
#: the native modules (built, so not among the package's .py files); ``from mlx_jupyter import _core``
NATIVE = ("mlx_jupyter._core", "mlx_jupyter._mlx_bridge")

#: The layers, top to bottom (docs/architecture.md's table): a module imports its own layer and those below.
#: The upper half runs where a cluster is driven; from the rank side down is what a rank's process loads,
#: so no rank imports the launcher, the configurator, ssh or the notebook side. A module's layer is its
#: longest prefix here (the package's own ``__init__``, ``mlx_jupyter``, is only itself).
LAYERS: list[tuple[str, tuple[str, ...]]] = [
    ("public faces", ("mlx_jupyter", "mlx_jupyter.__main__", "mlx_jupyter.cli", "mlx_jupyter.magics",
                      "mlx_jupyter.magic_help", "mlx_jupyter.ranks_progress", "mlx_jupyter.widgets",
                      "mlx_jupyter.server", "mlx_jupyter.commands", "mlx_jupyter.chatbox")),
    ("notebook side", ("mlx_jupyter.cluster",)),
    ("processes", ("mlx_jupyter.launch",)),
    ("configuration", ("mlx_jupyter.configurator", "mlx_jupyter.topology")),
    ("transport", ("mlx_jupyter.net", "mlx_jupyter.hostfile")),
    ("rank side", (RANK_SIDE,)),
    ("both sides", (SHARED,)),
    ("language models", ("mlx_jupyter.models",)),
    ("diagnosis", ("mlx_jupyter.where",)),
    ("collectives", ("mlx_jupyter.distributed", "mlx_jupyter.buffers", "mlx_jupyter.collective") + NATIVE),
    ("helpers", ("mlx_jupyter.safe_read", "mlx_jupyter.suggest", "mlx_jupyter.proc_identity",
                 "mlx_jupyter._source_tree")),
    ("vocabulary", (VOCAB,)),
]


def layer(module: str) -> int:
    """The index in :data:`LAYERS` of ``module``'s layer (LookupError: in none)."""
    found = [(len(prefix), i) for i, (_, prefixes) in enumerate(LAYERS) for prefix in prefixes
             if module == prefix or (prefix != "mlx_jupyter" and module.startswith(prefix + "."))]
    if not found:
        raise LookupError(f"{module} is in no layer: add it to LAYERS in tests/test_structure.py")
    return max(found)[1]


def test_every_module_has_a_layer() -> None:
    for name in module_names():
        layer(name)
    assert LAYERS[layer("mlx_jupyter.cluster.cells.run")][0] == "notebook side"
    assert LAYERS[layer("mlx_jupyter.cluster.rank.agent")][0] == "rank side"
    assert LAYERS[layer("mlx_jupyter.vocab.rank_env")][0] == "vocabulary"


def test_no_layer_imports_one_above_it() -> None:
    modules = module_names()
    known = set(modules) | set(NATIVE)
    wrong = []
    for name, path in modules.items():
        for imported in imports_of(name, path, known):
            if layer(imported) < layer(name):
                wrong.append(f"{name} ({LAYERS[layer(name)][0]}) imports {imported} ({LAYERS[layer(imported)][0]})")
    assert wrong == []


def test_the_vocabulary_imports_nothing_else_of_ours() -> None:
    """The vocabulary (option specs, backend records, the rank's environment, binding, limits, host and port
    rules) is the bottom: every layer may name it, and it names none."""
    modules = module_names()
    inside = [n for n in modules if n == VOCAB or n.startswith(VOCAB + ".")]
    assert {"mlx_jupyter.vocab.backends", "mlx_jupyter.vocab.rank_env", "mlx_jupyter.vocab.options"} <= set(inside)
    known = set(modules) | set(NATIVE)
    wrong = [f"{n} imports {i}" for n in inside for i in imports_of(n, modules[n], known)
             if not (i == VOCAB or i.startswith(VOCAB + "."))]
    assert wrong == []


def test_cycle_finder_finds_one() -> None:
    assert cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert cycle({"a": {"b"}, "b": set()}) == []


@pytest.mark.parametrize("name", [n for n in module_names() if not n.endswith("__main__")])
def test_every_module_imports(name: str) -> None:
    importlib.import_module(name)


def test_native_core_ships_type_stubs() -> None:
    """The build generates _core.pyi (nanobind stubgen) and installs it, with py.typed, beside the module."""
    core = importlib.import_module("mlx_jupyter._core")
    here = Path(core.__file__).parent
    stub = (here / "_core.pyi").read_text()
    assert (here / "py.typed").exists()
    for decl in ("class Group:", "def all_reduce_buffers(", "class Buffer:",
                 "class CommTimeoutError(DistributedError, TimeoutError):"):
        assert decl in stub, decl
