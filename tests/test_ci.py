"""CI requires every service and toolchain the suite uses (issue 11, "skips that also skip in
CI"): each name a test passes to :func:`tests.support.require.require` is in the default
``AGORA_REQUIRE`` of ``.ci/run``, so a missing one fails the suite there instead of skipping.
"""

from __future__ import annotations

import ast
import re

from tests.support.paths import REPO

# Names that are not a service to install: in-process backends whose ``available()`` the
# escape and every-backend suites pass through as their kind (wasmtime and pydantic-monty are
# Python dependencies, installed with the package).
IN_PROCESS = {"wasm", "python"}


def required_in_ci() -> set[str]:
    text = (REPO / ".ci" / "run").read_text()
    match = re.search(r'AGORA_REQUIRE="\$\{AGORA_REQUIRE:-([^}"]*)\}"', text)
    assert match, "no default AGORA_REQUIRE in .ci/run"
    return {name.strip() for name in match[1].split(",") if name.strip()}


def names_of(node: ast.expr) -> set[str]:
    """The service names a ``require(...)`` first argument can take: a string, or
    ``{kind: service, …}.get(kind, kind)`` (the kinds themselves included)."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return {node.value}
    if (
        isinstance(node, ast.Call)
        and isinstance(node.func, ast.Attribute)
        and isinstance(node.func.value, ast.Dict)
    ):
        return {v.value for v in node.func.value.values if isinstance(v, ast.Constant)}
    return set()


def required_by_tests() -> dict[str, str]:
    found: dict[str, str] = {}
    for path in sorted((REPO / "tests").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if (
                isinstance(node, ast.Call)
                and isinstance(node.func, ast.Name)
                and node.func.id == "require"
                and node.args
            ):
                for name in names_of(node.args[0]):
                    found.setdefault(name, str(path.relative_to(REPO)))
    return found


def test_every_required_service_is_required_in_ci() -> None:
    used = required_by_tests()
    assert {"docker", "postgres", "bwrap"} <= used.keys()  # the scan finds the known ones
    missing = {name: where for name, where in used.items() if name not in required_in_ci()}
    assert set(missing) <= IN_PROCESS, f"add to AGORA_REQUIRE in .ci/run: {missing}"
