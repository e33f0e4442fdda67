"""The language-model tests use the launcher tests' helpers (a live ``mlx-jupyter launch``)."""

from __future__ import annotations

import sys
from pathlib import Path

_LAUNCH = Path(__file__).resolve().parents[1] / "launch"
if str(_LAUNCH) not in sys.path:
    sys.path.insert(0, str(_LAUNCH))
