"""How a rank names a cell's code, as the notebook shows that cell: ``Cell In[3]`` with the
notebook's number, and the editor's line numbers (a ``%%mlx_distributed`` cell's code is on lines
2 and on: the magic's line is line 1).

The lines are shifted once, where IPython caches and parses the cell (its compiler's ``cache``
and ``ast_parse``): the code objects, so every frame, and linecache's copy of the cell then say
the editor's lines, and every reader agrees: tracebacks, pdb, the where samples, MLX's record.
"""

from __future__ import annotations

from typing import Any, Optional


def number_cells_as(shell: Any, count: int, first_line: int = 1) -> None:
    """Name the next cells ``In[count]`` (0: the rank's own number) with their code's first line
    numbered ``first_line`` (1: as written; 2 under ``%%mlx_distributed``). The execution count
    itself stays: the rank's history is keyed on it."""
    compiler = getattr(shell, "compile", None)
    if compiler is None or not hasattr(compiler, "cache") or not hasattr(compiler, "ast_parse"):
        return
    if not hasattr(compiler, "_mlxj_cache"):
        _install(compiler)
    compiler._mlxj_count = count
    compiler._mlxj_above = "\n" * max(first_line - 1, 0)


def _install(compiler: Any) -> None:
    """Wrap ``compiler``'s ``cache`` and ``ast_parse`` (once) to honour :func:`number_cells_as`."""
    compiler._mlxj_cache, compiler._mlxj_parse = compiler.cache, compiler.ast_parse
    compiler._mlxj_count, compiler._mlxj_above, compiler._mlxj_name = 0, "", None

    def cache(transformed_code: str, number: int = 0, raw_code: Optional[str] = None) -> str:
        above = compiler._mlxj_above
        if above:   # blank lines above the code (the raw code too: its own cache name, ipykernel's hash)
            transformed_code = above + transformed_code
            raw_code = above + raw_code if raw_code is not None else None
        name: str = compiler._mlxj_cache(transformed_code, compiler._mlxj_count or number, raw_code)
        compiler._mlxj_name = name if above else None
        return name

    def ast_parse(source: str, filename: str = "<unknown>", symbol: str = "exec") -> Any:
        # only the cell just cached: a magic's own parse (%time's expression) keeps its lines
        if compiler._mlxj_above and filename == compiler._mlxj_name:
            source = compiler._mlxj_above + source
        return compiler._mlxj_parse(source, filename, symbol)

    compiler.cache, compiler.ast_parse = cache, ast_parse
