"""Where the repository is, so no test counts ``parents[...]`` from its own location (tests move
when the source tree does)."""

from __future__ import annotations

from pathlib import Path
from typing import Final

REPO: Final = Path(__file__).resolve().parents[2]
"""The repository root (``agora serve`` runs from here; docs/, examples/ are below it)."""

DOCS_DIR: Final = REPO / "docs"

FIXTURES_DIR: Final = REPO / "tests" / "fixtures"
"""Golden files (tests/fixtures/events.jsonl: one stored event of every kind)."""
