"""The shipped viewer build matches ``web/`` (the suite's freshness check, like the schemas'),
and the check catches a stale or missing build; the Node stamp and the Python check hash the
same files the same way."""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

from hub.viewer.build import STATIC_DIR, WEB_DIR, check_build, source_files, source_hash
from tests.support.require import require_node


def copy_sources(root: Path) -> tuple[Path, Path]:
    web = root / "web"
    for path in source_files():
        target = web / path.relative_to(WEB_DIR)
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(path, target)
    (web / "scripts").mkdir()
    shutil.copyfile(WEB_DIR / "scripts" / "stamp.mjs", web / "scripts" / "stamp.mjs")
    static = root / "static"
    shutil.copytree(STATIC_DIR, static)
    return web, static


def test_the_shipped_build_matches_the_sources() -> None:
    assert check_build() is None, check_build()


def test_a_source_edit_without_a_rebuild_is_caught(tmp_path: Path) -> None:
    web, static = copy_sources(tmp_path)
    assert check_build(web, static) is None
    main = web / "src" / "main.tsx"
    main.write_text(main.read_text() + "\n// edited\n")
    problem = check_build(web, static)
    assert problem is not None and "stale" in problem


def test_unit_tests_are_not_part_of_the_build(tmp_path: Path) -> None:
    web, static = copy_sources(tmp_path)
    (web / "src" / "extra.test.ts").write_text("it('x', () => {});\n")
    assert check_build(web, static) is None


def test_a_missing_build_or_stamp_is_caught(tmp_path: Path) -> None:
    web, static = copy_sources(tmp_path)
    (static / "build.json").write_text("{}")
    assert "sourceHash" in (check_build(web, static) or "")
    (static / "index.html").unlink()
    assert "no built viewer" in (check_build(web, static) or "")


def test_node_stamps_the_hash_python_checks(tmp_path: Path) -> None:
    require_node()
    web, _ = copy_sources(tmp_path)
    out = tmp_path / "build.json"
    subprocess.run(
        ["node", str(web / "scripts" / "stamp.mjs"), str(web), str(out)],
        check=True,
        capture_output=True,
        timeout=60,
    )
    assert json.loads(out.read_text())["sourceHash"] == source_hash(web) == source_hash()
