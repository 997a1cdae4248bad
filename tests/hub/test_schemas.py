"""The generated JSON Schema files in schemas/ (hub/schemas.py) must be up to date."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from hub import schemas
from hub.core.events import KINDS
from tests.support.paths import REPO


def test_checked_in_schemas_are_fresh() -> None:
    assert schemas.SCHEMA_DIR == REPO / "schemas"
    assert schemas.stale() == [], "schemas/ is stale: run `python -m hub.schemas` and check in"


def test_output_is_deterministic_and_sorted() -> None:
    for _, types in schemas.SCHEMAS:
        a, b = schemas.render(types), schemas.render(types)
        assert a == b and a.endswith(b"}\n")
        doc = json.loads(a)
        assert list(doc) == sorted(doc)
        assert doc["$schema"].startswith("https://json-schema.org/")


def test_events_schema_has_every_kind() -> None:
    doc = json.loads((REPO / "schemas" / "events.json").read_text(encoding="utf-8"))
    tags = {
        d["properties"]["kind"]["enum"][0]
        for d in doc["$defs"].values()
        if "kind" in d.get("properties", {})
    }
    assert tags == set(KINDS)
    assert len(doc["anyOf"]) == len(KINDS)


def test_check_mode_lists_stale_files_and_writes_nothing(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert schemas.main(["--check", "--dir", str(tmp_path)]) == 1
    assert list(tmp_path.iterdir()) == []
    err = capsys.readouterr().err
    for name, _ in schemas.SCHEMAS:
        assert name in err
    assert schemas.main(["--dir", str(tmp_path)]) == 0
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(n for n, _ in schemas.SCHEMAS)
    assert schemas.main(["--check", "--dir", str(tmp_path)]) == 0
    (tmp_path / "events.json").write_text("{}\n")
    assert schemas.main(["--check", "--dir", str(tmp_path)]) == 1
    assert (tmp_path / "events.json").read_text() == "{}\n"
