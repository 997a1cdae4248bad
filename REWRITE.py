#!/usr/bin/env python3
"""Rewrite every ``from tests....conftest import X`` in tests/ to the module X lives in now.

What the conftests used to export moved to tests/support/ (shared) or to a helper module beside
the tests that use it (tests/backends/rigs.py, tests/hub/log/stores.py,
tests/a2a_adapter/peers.py); the conftests keep only fixtures. :data:`MOVES` maps each old
(conftest module, name) to its (new module, new name). A name that changed (``RuntimeHub`` ->
``HubProcess``, the runtime's ``mint`` -> ``mint_exec``, ``ROOT`` -> ``REPO``…) is renamed in the
importing file too (whole words, not attributes), unless it was imported ``as`` something.

Idempotent: a file with no conftest import is left alone, so running it again changes nothing.
Run from the repository root after merging branches whose tests still import conftests:

    python3 REWRITE.py            # rewrite, then ruff (imports sorted and merged) + ruff format
    python3 REWRITE.py --check    # exit 1 if some file still imports a conftest

It exits 1 naming the file and the name when it meets a name it has no mapping for (a new
helper someone added to a conftest): move that helper out of the conftest, add it to
:data:`MOVES`, run again.
"""

from __future__ import annotations

import argparse
import ast
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent
TESTS = ROOT / "tests"

SUPPORT = "tests.support"
HUB = f"{SUPPORT}.hub"
PEER = f"{SUPPORT}.peer"
TOKENS = f"{SUPPORT}.tokens"
PATHS = f"{SUPPORT}.paths"
POSTGRES = f"{SUPPORT}.postgres"
DOCKER = f"{SUPPORT}.docker"
REQUIRE = f"{SUPPORT}.require"
WAITING = f"{SUPPORT}.waiting"

# What every conftest re-exported from another one (the runtime's from the server's, …).
_REQUIRE = {"require": (REQUIRE, "require"), "required_services": (REQUIRE, "required_services")}
_POSTGRES = {
    "POSTGRES_DSN": (POSTGRES, "POSTGRES_DSN"),
    "pg_run": (POSTGRES, "pg_run"),
    "postgres_unavailable": (POSTGRES, "postgres_unavailable"),
}
_SERVER = {
    "REPO": (PATHS, "REPO"),
    "SECRET": (TOKENS, "SECRET"),
    "BANNER_TIMEOUT": (HUB, "BANNER_TIMEOUT"),
    "RECV_TIMEOUT": (PEER, "RECV_TIMEOUT"),
    "Frame": (PEER, "Frame"),
    "HubProcess": (HUB, "HubProcess"),
    "Peer": (PEER, "Peer"),
    "peer": (PEER, "peer"),
    "message": (PEER, "message"),
}

MOVES: dict[str, dict[str, tuple[str, str]]] = {
    "tests.conftest": _REQUIRE,
    "tests.hub.server.conftest": {**_SERVER, "mint": (TOKENS, "mint")},
    "tests.hub.runtime.conftest": {
        **_SERVER,
        **_REQUIRE,
        "RuntimeHub": (HUB, "HubProcess"),
        "ExecPeer": (PEER, "ExecPeer"),
        "exec_peer": (PEER, "exec_peer"),
        "of_exec": (PEER, "of_exec"),
        "of_kind": (PEER, "of_kind"),
        "mint": (TOKENS, "mint_exec"),
        "need_docker": (DOCKER, "need_docker"),
        "docker_ok": (DOCKER, "docker_available"),
    },
    "tests.hub.client.conftest": {
        "ROOT": (PATHS, "REPO"),
        "SECRET": (TOKENS, "SECRET"),
        "HubProcess": (HUB, "HubProcess"),
    },
    "tests.hub.cluster.conftest": {
        **_REQUIRE,
        **_POSTGRES,
        "REPO": (PATHS, "REPO"),
        "SECRET": (TOKENS, "SECRET"),
        "BANNER_TIMEOUT": (HUB, "BANNER_TIMEOUT"),
        "NodeProcess": (HUB, "HubProcess"),
        "StartNode": (HUB, "StartHub"),
        "wait_for": (WAITING, "wait_for"),
        "new_schema": (POSTGRES, "new_schema"),
        "url_for": (POSTGRES, "url_for"),
    },
    "tests.hub.log.conftest": {
        **_REQUIRE,
        **_POSTGRES,
        "StoreKind": ("tests.hub.log.stores", "StoreKind"),
        "STORE_KINDS": ("tests.hub.log.stores", "STORE_KINDS"),
    },
    "tests.a2a_adapter.conftest": {
        name: ("tests.a2a_adapter.peers", name)
        for name in ("WORKSPACE", "TokenFactory", "Worker", "fetch_card", "open_client")
    }
    | {"wait_for": (WAITING, "wait_for")},
    "tests.backends.conftest": {
        **_REQUIRE,
        **{
            name: ("tests.backends.rigs", name)
            for name in ("Rig", "Listener", "make_rig", "open_rig", "confined_open")
        },
        "_containers_of": ("tests.backends.rigs", "containers_of"),
        "_processes_with": ("tests.backends.rigs", "processes_with"),
        "drain": ("tests.backends.helpers", "drain"),
        "new_request": ("tests.backends.helpers", "new_request"),
        "docker_state": (DOCKER, "docker_available"),
        "TEST_OWNER": (DOCKER, "TEST_OWNER"),
    },
}

# Attributes of the client tests' old HubProcess that the one launcher spells differently.
ATTRIBUTES: dict[str, list[tuple[str, str]]] = {
    "tests.hub.client.conftest": [(r"(?<![\w.])(\w*hub)\.data\b(?!_)", r"\1.data_dir")],
}


def module_of(path: Path) -> str:
    return ".".join(path.relative_to(ROOT).with_suffix("").parts)


def resolve(path: Path, node: ast.ImportFrom) -> str:
    """The absolute module a (possibly relative) ``from … import`` names."""
    if node.level == 0:
        return node.module or ""
    package = module_of(path).split(".")[: -node.level]
    return ".".join([*package, *([node.module] if node.module else [])])


def is_conftest(module: str) -> bool:
    return module.rsplit(".", 1)[-1] == "conftest"


def rewrite(path: Path, errors: list[str]) -> bool:
    """Rewrite ``path`` in place; whether it changed."""
    text = path.read_text()
    tree = ast.parse(text, str(path))
    lines = text.splitlines(keepends=True)
    edits: list[tuple[int, int, str]] = []  # (first line, last line, replacement), 0-based
    renames: dict[str, str] = {}
    attributes: list[tuple[str, str]] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import) and any(is_conftest(a.name) for a in node.names):
            errors.append(f"{path}:{node.lineno}: `import …conftest`: rewrite it by hand")
            continue
        if not isinstance(node, ast.ImportFrom):
            continue
        module = resolve(path, node)
        if not is_conftest(module):
            continue
        moves = MOVES.get(module, {})
        grouped: dict[str, list[str]] = {}
        for alias in node.names:
            if alias.name not in moves:
                errors.append(f"{path}:{node.lineno}: no mapping for {module}.{alias.name}")
                continue
            new_module, new_name = moves[alias.name]
            if alias.asname is not None and alias.asname != new_name:
                grouped.setdefault(new_module, []).append(f"{new_name} as {alias.asname}")
            else:
                grouped.setdefault(new_module, []).append(new_name)
                if alias.asname is None and new_name != alias.name:
                    renames[alias.name] = new_name
        attributes += ATTRIBUTES.get(module, [])
        indent = " " * node.col_offset
        new = "".join(
            f"{indent}from {mod} import {', '.join(names)}\n" for mod, names in grouped.items()
        )
        assert node.end_lineno is not None
        edits.append((node.lineno - 1, node.end_lineno - 1, new))
    if not edits or any(e.startswith(f"{path}:") for e in errors):
        return False
    for first, last, new in sorted(edits, reverse=True):
        lines[first : last + 1] = [new]
    out = "".join(lines)
    for old, new in renames.items():
        out = re.sub(rf"(?<![\w.]){re.escape(old)}\b", new, out)
    for pattern, replacement in attributes:
        out = re.sub(pattern, replacement, out)
    path.write_text(out)
    return True


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--check", action="store_true", help="only report conftest imports")
    args = parser.parse_args()
    errors: list[str] = []
    changed: list[Path] = []
    for path in sorted(TESTS.rglob("*.py")):
        if args.check:
            tree = ast.parse(path.read_text(), str(path))
            for node in ast.walk(tree):
                if isinstance(node, ast.ImportFrom) and is_conftest(resolve(path, node)):
                    errors.append(f"{path}:{node.lineno}: imports {resolve(path, node)}")
            continue
        if rewrite(path, errors):
            changed.append(path)
    if changed:
        names = [str(p) for p in changed]
        ruff = [sys.executable, "-m", "ruff"]
        subprocess.run([*ruff, "check", "--quiet", "--fix", "--select", "I,F401", *names])
        subprocess.run([*ruff, "format", "--quiet", *names], check=True)
        print("\n".join(f"rewrote {p.relative_to(ROOT)}" for p in changed))
    for error in errors:
        print(error, file=sys.stderr)
    return 1 if errors else 0


if __name__ == "__main__":
    sys.exit(main())
