"""Shared helpers for the topology tests: where the recorded clusters live."""

from __future__ import annotations

import json
from pathlib import Path

FIXTURES = Path(__file__).resolve().parent.parent / "fixtures" / "thunderbolt"
SCENARIOS = sorted(p.name for p in FIXTURES.iterdir() if (p / "expected.json").exists())
MALFORMED = sorted(p.name for p in (FIXTURES / "malformed").iterdir() if p.is_dir())


def expected(case: str) -> dict:
    return json.loads((FIXTURES / case / "expected.json").read_text())

