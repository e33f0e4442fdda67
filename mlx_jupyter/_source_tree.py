"""A source checkout found on ``sys.path`` before the installed package, without the compiled core.

A Jupyter kernel or rank started in a clone has the clone on ``sys.path`` first, so ``import
mlx_jupyter`` finds the checkout's sources, which have no ``_core`` after a plain ``pip install .``
(an editable install routes the import to its build). Then the installed copy that has the core is
loaded in the checkout's place; with no such copy, importing ``_core`` raises an ImportError that
says what shadows what and how to fix it. Imports nothing from the package.
"""

from __future__ import annotations

import importlib.machinery
import importlib.util
import os
import sys
from pathlib import Path
from types import ModuleType
from typing import Optional

PACKAGE = "mlx_jupyter"


def core_findable() -> bool:
    """Whether ``mlx_jupyter._core`` can be found through the package being imported (its ``__path__``)."""
    try:
        return importlib.util.find_spec(f"{PACKAGE}._core") is not None
    except (ImportError, ValueError):
        return False


def _has_core(package_dirs: list[str]) -> bool:
    return importlib.machinery.PathFinder.find_spec(f"{PACKAGE}._core", package_dirs) is not None


def installed_copy(tree: Path) -> Optional[importlib.machinery.ModuleSpec]:
    """The first other ``mlx_jupyter`` package on ``sys.path`` (not ``tree``) that has its ``_core``."""
    for entry in sys.path:
        try:
            base = Path(entry or os.getcwd()).resolve()
        except OSError:
            continue
        if base == tree.parent:
            continue
        spec = importlib.machinery.PathFinder.find_spec(PACKAGE, [str(base)])
        if spec is None or not spec.origin or not spec.submodule_search_locations:
            continue   # not there, or only a namespace portion (an editable install's wheel files)
        if Path(spec.origin).resolve().parent != tree and _has_core(list(spec.submodule_search_locations)):
            return spec
    return None


def load_instead(spec: importlib.machinery.ModuleSpec) -> ModuleType:
    """Execute the installed package and register it as ``mlx_jupyter`` (the import then returns it)."""
    module = importlib.util.module_from_spec(spec)
    sys.modules.pop(__name__, None)   # the installed copy imports its own helper, not this checkout's
    sys.modules[PACKAGE] = module
    try:
        assert spec.loader is not None
        spec.loader.exec_module(module)
    except BaseException:
        sys.modules.pop(PACKAGE, None)
        raise
    return module


def step_aside(tree: Path) -> bool:
    """Called by the package's ``__init__``: load the installed copy instead when ``tree`` lacks the core.

    Returns True when it did (the caller then stops initialising itself).
    """
    if core_findable():
        return False
    spec = installed_copy(tree)
    if spec is None:
        return False
    load_instead(spec)
    return True


def missing_core_error(tree: Path) -> ImportError:
    """The error for ``from mlx_jupyter import _core`` when no copy with a built core is importable."""
    root = tree.parent
    checkout = (root / "pyproject.toml").is_file()
    where = (f"{tree} is a source checkout whose compiled core (_core) is not built, and no installed "
             f"mlx-jupyter with a built core is on sys.path ({sys.executable})")
    fix = (f"install the checkout in editable mode (`{sys.executable} -m pip install -e {root}`: it builds the "
           f"core and routes imports from the checkout to it), or start Python from another directory" if checkout else
           f"reinstall mlx-jupyter into this interpreter's environment ({sys.executable} -m pip install mlx-jupyter)")
    return ImportError(f"{where}: {fix}", name=f"{PACKAGE}._core")
