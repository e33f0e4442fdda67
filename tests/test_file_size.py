"""No source file over 450 lines (issue 46 §4): a module that grows past it is split by responsibility."""

from __future__ import annotations

from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
LIMIT = 450
#: where the sources are, and which of their files count
SOURCES = {"mlx_jupyter": (".py",), "native": (".cpp", ".h", ".hpp", ".mm"), "labextension/src": (".ts", ".tsx")}


def source_files() -> list[Path]:
    """Every source file of the package, the native core and the lab extension."""
    found = []
    for folder, suffixes in SOURCES.items():
        for path in sorted((ROOT / folder).rglob("*")):
            if path.is_file() and path.suffix in suffixes and "node_modules" not in path.parts:
                found.append(path)
    return found


def line_count(path: Path) -> int:
    with path.open("rb") as f:
        return sum(1 for _ in f)


def test_sources_are_found() -> None:
    names = {p.relative_to(ROOT).as_posix() for p in source_files()}
    assert {"mlx_jupyter/distributed.py", "native/src/group.cpp", "native/include/mlxj/group.h",
            "labextension/src/panel.ts"} <= names


def test_no_source_file_is_over_the_limit() -> None:
    over = sorted((line_count(p), p.relative_to(ROOT).as_posix()) for p in source_files())
    over = [(n, name) for n, name in over if n > LIMIT]
    assert not over, (f"{len(over)} source file(s) over {LIMIT} lines; split each by responsibility (one job a "
                      "module, a name that says what it holds), not at a line count:\n"
                      + "\n".join(f"  {name}: {n} lines" for n, name in reversed(over)))
