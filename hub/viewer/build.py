"""The shipped build of the viewer matches its source: ``python3 -m hub.viewer --check``.

``npm run build`` in ``web/`` writes the bundle to ``hub/viewer/static/`` (so ``pip install``
ships it and no one needs Node to run the hub) and stamps ``build.json`` there with
:func:`source_hash` of the sources it was built from (``web/scripts/stamp.mjs`` computes the
same hash). The check recomputes the hash from ``web/`` and compares: a source edited without
rebuilding fails it, like ``python3 -m hub.schemas --check`` for a stale schema.

The hash covers the files that shape the bundle: ``index.html``, the npm manifest and lock,
the TypeScript and Vite configuration, and ``src/`` without its unit tests (``*.test.ts``):
for each file, sorted by its POSIX path relative to ``web/``, the line
``<path>\\0<sha256 hex of the bytes>\\n``, and the sha256 of all those lines.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Final

STATIC_DIR: Final = Path(__file__).resolve().parent / "static"
"""The built assets (``index.html``, ``assets/``, ``build.json``), package data."""

WEB_DIR: Final = Path(__file__).resolve().parents[2] / "web"
"""The front-end source, present in a source checkout only."""

TOP_FILES: Final = (
    "index.html",
    "package.json",
    "package-lock.json",
    "tsconfig.json",
    "vite.config.ts",
)


def source_files(web: Path = WEB_DIR) -> list[Path]:
    """The files :func:`source_hash` covers, sorted by relative path."""
    files = [web / name for name in TOP_FILES if (web / name).is_file()]
    src = web / "src"
    if src.is_dir():
        files += [
            p
            for p in src.rglob("*")
            if p.is_file() and not p.name.endswith((".test.ts", ".test.tsx"))
        ]
    return sorted(files, key=lambda p: p.relative_to(web).as_posix())


def source_hash(web: Path = WEB_DIR) -> str:
    """The sha256 (hex) of the viewer's sources (see the module doc)."""
    outer = hashlib.sha256()
    for path in source_files(web):
        digest = hashlib.sha256(path.read_bytes()).hexdigest()
        outer.update(f"{path.relative_to(web).as_posix()}\0{digest}\n".encode())
    return outer.hexdigest()


def recorded_hash(static: Path = STATIC_DIR) -> str | None:
    """The source hash the shipped build was stamped with, or None (no build, no stamp)."""
    try:
        info = json.loads((static / "build.json").read_text())
    except (OSError, ValueError):
        return None
    value = info.get("sourceHash") if isinstance(info, dict) else None
    return value if isinstance(value, str) else None


def check_build(web: Path = WEB_DIR, static: Path = STATIC_DIR) -> str | None:
    """None when the shipped build was made from the current sources, else what is wrong."""
    if not (static / "index.html").is_file():
        return f"no built viewer in {static}: run `npm ci && npm run build` in web/"
    recorded = recorded_hash(static)
    if recorded is None:
        return f"{static / 'build.json'} is missing or has no sourceHash: rebuild the viewer"
    current = source_hash(web)
    if recorded != current:
        return (
            f"the viewer build is stale (built from {recorded[:12]}, sources are "
            f"{current[:12]}): run `npm run build` in web/ and commit hub/viewer/static"
        )
    return None
