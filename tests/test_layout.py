"""The tests mirror the source tree, and share code through tests/support/, not conftests.

* Every source module ``hub/…/x.py``, ``backends/…/x.py``, ``a2a_adapter/…/x.py`` has its test
  file at the same place under tests/ (``tests/hub/…/test_x.py``), or an entry in
  :data:`COVERED_ELSEWHERE` saying which tests cover it (and the entry goes once it has one).
* No test module imports a conftest (conftests hold fixtures; what tests import lives in
  tests/support/ or in a helper module beside them).
* Every test directory is a package, so two ``test_client.py`` in different places never clash.
* No two public classes or module-level type aliases of the source share a name (issue #10:
  one name, one meaning; a module's private ``_Name`` helpers are its own business).

Package ``__init__.py`` files are not counted: they re-export; logic lives in named modules.
"""

from __future__ import annotations

import ast
from collections import defaultdict
from collections.abc import Iterator
from pathlib import Path
from typing import Final

from tests.support.paths import REPO

SOURCE_ROOTS: Final = ("hub", "backends", "a2a_adapter")
TESTS: Final = REPO / "tests"

_AUDIT_CLI = "the audit CLI, through hub.cli.main: tests/hub/commands/test_audit_cli.py"
_SHIM = "re-export shim of a public import path (the module moved to hub/core/)"

COVERED_ELSEWHERE: Final[dict[str, str]] = {
    # -- added this round: covered by the tests of their package or door ---------------------
    "hub/server/supervisor.py": "`agora serve --workers 2` as a real process (start, "
    "banner, a killed worker restarted, recovery once, SIGTERM exit 0): "
    "tests/hub/server/test_workers.py",
    "hub/server/blob_ops.py": "the blob ops over real hubs (SQLite, PostgreSQL): "
    "tests/hub/client/test_blobs.py",
    "a2a_adapter/inline.py": "small artifacts inline, forged URL parts not: "
    "tests/a2a_adapter/test_files.py",
    "a2a_adapter/responses.py": "exact numbers and SSE ids on the wire: "
    "tests/a2a_adapter/test_numbers.py, test_resume.py",
    "backends/cgroups.py": "run cgroups (v1/v2): tests/backends/test_confine.py, test_escape.py",
    "backends/mock.py": "the mock backend is the subject of tests/backends/test_every_backend.py",
    "backends/javascript/bootstrap.py": "tests/backends/javascript/test_backend.py",
    "backends/javascript/channel.py": "tests/backends/javascript/test_backend.py",
    "backends/container/attach.py": "tests/backends/container/test_backend.py",
    "backends/container/engine.py": "tests/backends/container/test_backend.py, test_images.py",
    "backends/container/mounts.py": "tests/backends/container/test_backend.py",
    "backends/container/spec.py": "tests/backends/container/test_backend.py",
    "backends/rust/diagnostics.py": "tests/backends/rust/test_backend.py",
    "backends/rust/settings.py": "tests/hub/runtime/test_settings.py, rust/test_backend.py",
    "backends/rust/source.py": "tests/backends/rust/test_backend.py",
    "backends/wasm/cache.py": "tests/backends/wasm/test_backend.py",
    "backends/wasm/interrupt.py": "timeouts and kills: tests/backends/wasm/test_backend.py",
    "hub/commands/checkpoint.py": "tests/hub/commands/test_audit_checkpoints.py",
    "hub/commands/prove.py": "tests/hub/commands/test_audit_checkpoints.py",
    "hub/commands/verify_proof.py": "tests/hub/commands/test_audit_checkpoints.py",
    "hub/core/execution/settings.py": "tests/hub/runtime/test_settings.py",
    "hub/revocations.py": "over real sockets: tests/hub/server/test_revocation.py, "
    "tests/a2a_adapter/test_revocation.py, tests/hub/cluster/test_revocation.py",
    "hub/runtime/execution.py": "one run's lifecycle: tests/hub/runtime/test_exec.py",
    "hub/runtime/outcome.py": "the runtime's own outcomes: tests/hub/runtime/test_exec.py",
    "hub/runtime/pruning.py": "tests/hub/runtime/test_retention.py",
    "hub/runtime/request.py": "tests/hub/runtime/test_protocol_exec.py",
    "hub/server/owner.py": "tests/hub/server/test_app.py",
    # -- entry points and composition, run by every black-box test ----------------------------
    "hub/__main__.py": "``python -m hub``: every agora serve of tests/support/hub.py",
    "hub/cli.py": "argument parsing and dispatch: the tests/hub/commands/ tests drive hub.cli.main",
    "hub/commands/serve.py": "every agora serve of tests/support/hub.py (server, runtime, cluster, "
    "client tests); its banner is parsed there",
    "a2a_adapter/app.py": "the A2A service over real HTTP: tests/a2a_adapter/test_server.py, "
    "test_http.py, test_collab.py",
    # -- CLI commands -------------------------------------------------------------------------
    "hub/commands/_audit.py": _AUDIT_CLI,
    "hub/commands/append.py": _AUDIT_CLI,
    "hub/commands/export.py": f"{_AUDIT_CLI}; tests/hub/cluster/test_export_import.py",
    "hub/commands/import_.py": f"{_AUDIT_CLI}; tests/hub/cluster/test_export_import.py",
    "hub/commands/replay.py": _AUDIT_CLI,
    "hub/commands/state.py": _AUDIT_CLI,
    "hub/commands/verify.py": _AUDIT_CLI,
    "hub/commands/workspaces.py": _AUDIT_CLI,
    "hub/commands/db.py": "``agora db migrate``: tests/hub/log/test_postgres.py",
    "hub/commands/backends.py": "``agora backends``: tests/hub/runtime/test_registry.py",
    "hub/commands/images.py": "``agora images``: tests/backends/container/test_images.py",
    "hub/commands/tool_schema.py": "``agora tool-schema``: tests/backends/test_code_tool.py",
    # -- the core -----------------------------------------------------------------------------
    "hub/core/capability.py": "the capability a token grants: tests/hub/test_auth.py, "
    "tests/hub/core/wire/test_session.py",
    "hub/core/records.py": "plain result records of the stores: tests/hub/log/test_conformance.py",
    "hub/core/wire/frames.py": "decoded and encoded by the session: "
    "tests/hub/core/wire/test_session.py",
    "hub/core/execution/capabilities.py": "declared by every backend: "
    "tests/backends/test_conformance.py",
    "hub/core/execution/errors.py": "tests/hub/core/execution/test_policy.py (EXEC_CODES)",
    "hub/core/execution/request.py": "tests/hub/core/execution/test_policy.py, "
    "tests/backends/test_conformance.py",
    "hub/core/execution/result.py": "tests/backends/test_conformance.py, test_harness.py",
    "hub/core/execution/validate.py": "tests/hub/core/execution/test_policy.py",
    "hub/errors.py": _SHIM,
    "hub/events.py": _SHIM,
    "backends/errors.py": _SHIM,
    # -- the log ------------------------------------------------------------------------------
    "hub/log/base.py": "the EventStore interface: tests/hub/log/test_conformance.py",
    "hub/log/migrations.py": "tests/hub/log/test_postgres.py",
    "hub/log/writer.py": "the group-commit writer: tests/hub/log/test_conformance.py, "
    "test_crash.py",
    # -- cluster, runtime, client -------------------------------------------------------------
    "hub/cluster/node.py": "real nodes on one PostgreSQL: tests/hub/cluster/test_nodes.py",
    "hub/runtime/access.py": "the python backend's workspace files: tests/hub/runtime/test_exec.py",
    # -- backends -----------------------------------------------------------------------------
    "backends/base.py": "the CodeExecutor protocol: tests/backends/test_conformance.py",
    "backends/access.py": "the WorkspaceAccess protocol: tests/backends/test_monty.py",
    "backends/output.py": "tests/backends/test_captured.py, test_harness.py",
    "backends/runs.py": "tests/backends/test_lifecycle.py",
    "backends/sink.py": "tests/backends/test_captured.py",
    # -- the A2A door -------------------------------------------------------------------------
    "a2a_adapter/auth.py": "bearer authentication: tests/a2a_adapter/test_http.py",
    "a2a_adapter/handler.py": "the request handler, through the a2a-sdk client: "
    "tests/a2a_adapter/test_server.py",
    "a2a_adapter/runtime.py": "agora.exec over A2A: tests/a2a_adapter/test_exec_runtime.py",
    "a2a_adapter/taskview.py": "tests/a2a_adapter/test_mapping.py",
}
"""Modules covered through a neighbour's tests: module -> where (why no file of its own)."""


def source_modules() -> list[str]:
    """Source modules as repository-relative paths (``hub/core/events.py``)."""
    return sorted(
        path.relative_to(REPO).as_posix()
        for root in SOURCE_ROOTS
        for path in (REPO / root).rglob("*.py")
        if path.name != "__init__.py"
    )


def mirror(module: str) -> Path:
    """Where the test file of ``module`` goes: ``hub/core/events.py`` ->
    ``tests/hub/core/test_events.py``."""
    path = Path(module)
    return TESTS / path.parent / f"test_{path.name}"


def test_every_module_has_a_mirrored_test_file_or_a_reason() -> None:
    missing = [
        f"{m} (tests: {mirror(m).relative_to(REPO)})"
        for m in source_modules()
        if not mirror(m).exists() and m not in COVERED_ELSEWHERE
    ]
    assert not missing, (
        "source modules without a mirrored test file: write it, or say in "
        "tests/test_layout.py COVERED_ELSEWHERE which tests cover the module:\n  "
        + "\n  ".join(missing)
    )


def test_the_allow_list_names_only_modules_without_a_test_file() -> None:
    modules = set(source_modules())
    stale = [
        f"{m}: {'gone' if m not in modules else 'has ' + str(mirror(m).relative_to(REPO))}"
        for m in COVERED_ELSEWHERE
        if m not in modules or mirror(m).exists()
    ]
    assert not stale, "drop these COVERED_ELSEWHERE entries:\n  " + "\n  ".join(stale)


def python_files() -> list[Path]:
    """The Python files under tests/ (not the installed node packages of the A2A interop)."""
    return sorted(p for p in TESTS.rglob("*.py") if ".node" not in p.parts)


def imported_modules(path: Path) -> list[tuple[int, str]]:
    """``(line, absolute module)`` of each ``from … import`` in ``path``."""
    package = path.relative_to(REPO).with_suffix("").parts[:-1]
    found = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.ImportFrom):
            base = list(package[: len(package) - node.level + 1]) if node.level else []
            found.append((node.lineno, ".".join([*base, *([node.module] if node.module else [])])))
        elif isinstance(node, ast.Import):
            found += [(node.lineno, alias.name) for alias in node.names]
    return found


def test_no_test_module_imports_a_conftest() -> None:
    offenders = [
        f"{path.relative_to(REPO)}:{line}: {module}"
        for path in python_files()
        for line, module in imported_modules(path)
        if module.rsplit(".", 1)[-1] == "conftest"
    ]
    assert not offenders, (
        "conftests hold fixtures only; import from tests/support/ (or the helper module "
        "beside the tests) instead:\n  " + "\n  ".join(offenders)
    )


def test_every_test_directory_is_a_package() -> None:
    missing = sorted(
        {
            p.parent.relative_to(REPO).as_posix()
            for p in TESTS.rglob("test_*.py")
            if ".node" not in p.parts and not (p.parent / "__init__.py").exists()
        }
    )
    assert not missing, f"add an __init__.py to: {missing}"


def type_aliases(tree: ast.Module) -> Iterator[tuple[str, int]]:
    """A module's public type aliases, by name and line: ``X: TypeAlias = …``, and ``X = …``
    whose value is a union (``A | B``) or a subscripted type (``Literal[…]``, ``Callable[…]``,
    ``tuple[…]``) with a CapWords name (constants are UPPER_CASE, TypeVars are calls)."""
    for node in tree.body:
        if isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            annotation = ast.unparse(node.annotation)
            if annotation in ("TypeAlias", "typing.TypeAlias"):
                yield node.target.id, node.lineno
        elif (
            isinstance(node, ast.Assign)
            and len(node.targets) == 1
            and isinstance(target := node.targets[0], ast.Name)
            and target.id[:1].isupper()
            and not target.id.isupper()
            and (
                isinstance(node.value, ast.Subscript)
                or (isinstance(node.value, ast.BinOp) and isinstance(node.value.op, ast.BitOr))
            )
        ):
            yield target.id, node.lineno


def test_type_aliases_are_found() -> None:
    tree = ast.parse(
        "Commit: TypeAlias = Callable[[], None]\nMode = Literal['x']\nEither = Left | Right\n"
        "LIMIT = sizes[1]\nT = TypeVar('T')\n_Private = Left | Right\nlog = get('x')\n"
    )
    assert [name for name, _ in type_aliases(tree)] == ["Commit", "Mode", "Either"]


def test_no_two_public_classes_or_type_aliases_share_a_name() -> None:
    where: defaultdict[str, list[str]] = defaultdict(list)
    for module in source_modules():
        tree = ast.parse((REPO / module).read_text(), module)
        for node in ast.walk(tree):
            if isinstance(node, ast.ClassDef) and not node.name.startswith("_"):
                where[node.name].append(f"{module}:{node.lineno}")
        for name, line in type_aliases(tree):
            where[name].append(f"{module}:{line} (alias)")
    shared = [f"{name}: {', '.join(places)}" for name, places in where.items() if len(places) > 1]
    assert not shared, "one name, one meaning; rename one of:\n  " + "\n  ".join(shared)
