"""The ``rust`` backend: validation, diagnostics parsing (pure) and the check → build → run
pipeline (needs rustc, cargo and Debian's serde_json: skipped without them, failed in CI when
``AGORA_REQUIRE`` lists ``rust``)."""

from __future__ import annotations

import asyncio
import json
import shutil
import uuid
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from backends.base import (
    DependencyNotFound,
    ExecutionLanguage,
    ExecutionRequest,
    ExecutionResult,
    InvalidCode,
    Source,
    collect,
)
from backends.rust import DEBIAN_REGISTRY, RustBackend, RustToolchain
from backends.rust.diagnostics import errors, parse_diagnostics, to_diagnostic
from backends.rust.source import strip_comments_and_literals, validate_rust_source, wrap
from tests.backends.helpers import host_rust_settings, new_request
from tests.support.require import require

RUN_OK = """
fn run(input: serde_json::Value) -> serde_json::Value {
    let n = input["n"].as_i64().unwrap_or(0);
    println!("computing");
    serde_json::json!({"double": n * 2, "echo": input})
}
"""

TYPE_ERROR = """fn run(input: serde_json::Value) -> serde_json::Value {
    let count: i32 = "three";
    input
}
"""

PANICS = """fn run(_input: serde_json::Value) -> serde_json::Value {
    panic!("boom");
}
"""

LOOPS = """fn run(_input: serde_json::Value) -> serde_json::Value {
    loop { std::hint::black_box(0); }
}
"""


def unique(source: str) -> str:
    """The same program with a fresh comment, so it misses the build cache."""
    return f"// {uuid.uuid4()}\n{source}"


# ---------------------------------------------------------------------------------------------
# validate_rust_source and the harness (pure)


@pytest.mark.parametrize(
    ("source", "reason"),
    [
        ("fn main() {}\nfn run(i: serde_json::Value) -> serde_json::Value { i }", "fnMain"),
        (
            "pub fn   main ( ) { }\nfn run(i: serde_json::Value) -> serde_json::Value { i }",
            "fnMain",
        ),
        (
            "#![allow(unused)]\nfn run(i: serde_json::Value) -> serde_json::Value { i }",
            "crateAttribute",
        ),
        ("fn helper() {}", "noRun"),
        ("// only a comment", "empty"),
    ],
)
def test_validate_refuses(source: str, reason: str) -> None:
    with pytest.raises(InvalidCode) as caught:
        validate_rust_source(source)
    assert caught.value.details["reason"] == reason


@pytest.mark.parametrize(
    "source",
    [
        "// fn main() {}\nfn run(i: serde_json::Value) -> serde_json::Value { i }",
        "/* outer /* nested fn main */ still comment #![x] */\n"
        "fn run(i: serde_json::Value) -> serde_json::Value { i }",
        'fn run(i: serde_json::Value) -> serde_json::Value { let _ = "fn main() #![x]"; i }',
        'fn run(i: serde_json::Value) -> serde_json::Value { let _ = r#"fn main "quoted""#; i }',
        "fn run<'a>(i: serde_json::Value) -> serde_json::Value { let _c = '\"'; i }",
        "#[derive(Debug)]\nstruct S;\nfn run(i: serde_json::Value) -> serde_json::Value { i }",
        "fn mainly() {}\nfn run(i: serde_json::Value) -> serde_json::Value { i }",
    ],
)
def test_validate_accepts(source: str) -> None:
    validate_rust_source(source)


def test_strip_keeps_lines_and_code() -> None:
    source = (
        "let a = 1; // COMMENT\n/* BLOCK\nBLOCK */ let b = \"STR\nING\"; let c = 'Q';\n"
        "let d: &'static str;"
    )
    stripped = strip_comments_and_literals(source)
    assert stripped.count("\n") == source.count("\n")
    assert "let a = 1;" in stripped and "let d: &'static str;" in stripped
    for gone in ("COMMENT", "BLOCK", "STR", "ING", "Q"):
        assert gone not in stripped


def test_harness_puts_user_code_first() -> None:
    crate = wrap("fn run(i: serde_json::Value) -> serde_json::Value { i }")
    assert crate.startswith("fn run(")
    assert "fn main()" in crate and "serde_json::Value::Null" in crate


# ---------------------------------------------------------------------------------------------
# parse_diagnostics (pure)


def _span(column: int, end: int, primary: bool, label: str) -> dict[str, Any]:
    line = '    let count: i32 = "three";'
    return {
        "file_name": "main.rs",
        "byte_start": 0,
        "byte_end": 0,
        "line_start": 2,
        "line_end": 2,
        "column_start": column,
        "column_end": end,
        "is_primary": primary,
        "label": label,
        "text": [{"text": line, "highlight_start": column, "highlight_end": end}],
    }


_MISMATCH = {
    "$message_type": "diagnostic",
    "message": "mismatched types",
    "code": {"code": "E0308", "explanation": "..."},
    "level": "error",
    "spans": [
        _span(22, 29, True, "expected `i32`, found `&str`"),
        _span(16, 19, False, "expected due to this"),
    ],
    "children": [],
    "rendered": "error[E0308]: mismatched types\n",
}
_UNUSED = {
    "$message_type": "diagnostic",
    "message": "unused variable: `x`",
    "code": {"code": "unused_variables", "explanation": None},
    "level": "warning",
    "spans": [],
    "children": [{"message": "prefix it with an underscore", "level": "help", "spans": []}],
    "rendered": "warning: unused variable\n",
}
_ABORTING = {
    "$message_type": "diagnostic",
    "message": "aborting due to 1 previous error",
    "code": None,
    "level": "error",
    "spans": [],
    "children": [],
    "rendered": "error: aborting\n",
}
RUSTC_OUTPUT = "\n".join(
    [
        json.dumps(_MISMATCH),
        "this line is not JSON at all",
        '{"truncated json',
        json.dumps({"$message_type": "artifact", "artifact": "x.rmeta", "emit": "metadata"}),
        '["a", "list"]',
        json.dumps(_UNUSED),
        json.dumps(_ABORTING),
    ]
)


def test_parse_diagnostics_reads_spans_and_skips_bad_lines() -> None:
    parsed = parse_diagnostics(RUSTC_OUTPUT)
    assert [d.level for d in parsed] == ["error", "warning", "error"]
    first = parsed[0]
    assert (first.message, first.code) == ("mismatched types", "E0308")
    primary = first.primary_span
    assert primary is not None
    assert (primary.file, primary.line, primary.column, primary.end_column) == (
        "main.rs",
        2,
        22,
        29,
    )
    assert primary.text == '"three"' and primary.label == "expected `i32`, found `&str`"
    assert first.spans[1].text == "i32" and not first.spans[1].primary
    assert parsed[1].children == ["help: prefix it with an underscore"]
    assert [d.message for d in errors(parsed)] == ["mismatched types"]
    as_result = to_diagnostic(first)
    assert as_result.level == "error" and as_result.code == "E0308"
    assert as_result.data["line"] == 2 and as_result.data["column"] == 22


def test_parse_diagnostics_of_nothing() -> None:
    assert parse_diagnostics("") == []
    assert parse_diagnostics(b"\xff\xfe not utf-8\n{}") == []


async def test_missing_serde_json_is_dependency_not_found(tmp_path: Path) -> None:
    toolchain = RustToolchain(
        settings=host_rust_settings(), cache_dir=tmp_path / "cache", registry=tmp_path / "registry"
    )
    await toolchain.probe()
    require("rust", toolchain.rustc is not None, toolchain.problem)
    with pytest.raises(DependencyNotFound) as caught:
        await toolchain.deps()
    assert caught.value.details["searched"] == [str(tmp_path / "registry" / "serde_json-*")]
    assert caught.value.details["execCode"] == "dependencyNotFound"


# ---------------------------------------------------------------------------------------------
# The pipeline (real rustc)


def rust_state() -> tuple[bool, str]:
    if shutil.which("rustc") is None or shutil.which("cargo") is None:
        return False, "rustc or cargo is not installed"
    if not list(DEBIAN_REGISTRY.glob("serde_json-*")):
        return False, f"no serde_json in {DEBIAN_REGISTRY} (apt-get install librust-serde-json-dev)"
    return True, ""


@pytest.fixture
async def backend() -> AsyncIterator[RustBackend]:
    ok, why = rust_state()
    require("rust", ok, why)
    async with RustBackend(settings=host_rust_settings()) as made:
        await made.prepare()  # serde_json, built once per rustc version and cached on disk
        yield made


def request(backend: RustBackend, source: str, **kw: Any) -> ExecutionRequest:
    return new_request(backend, language=ExecutionLanguage.RUST, payload=Source(source), **kw)


async def run(backend: RustBackend, source: str, **kw: Any) -> ExecutionResult:
    return await collect(backend.execute(request(backend, source, **kw), None))


async def test_success_with_value(backend: RustBackend) -> None:
    result = await run(backend, unique(RUN_OK), input={"n": 21})
    assert (result.status, result.reason, result.exit_code) == ("completed", "exit", 0), result
    assert result.value == {"double": 42, "echo": {"n": 21}}
    assert result.stdout == b"computing\n"
    assert result.metadata is not None and result.metadata.language == "rust"


async def test_no_input_is_null(backend: RustBackend) -> None:
    result = await run(backend, "fn run(i: serde_json::Value) -> serde_json::Value { i }")
    assert result.has_value and result.value is None


async def test_type_error_returns_diagnostics(backend: RustBackend) -> None:
    builds = backend.builds
    result = await run(backend, TYPE_ERROR)
    assert (result.status, result.reason) == ("failed", "compileFailed")
    error = next(d for d in result.diagnostics if d.level == "error")
    assert error.code == "E0308" and error.message == "mismatched types"
    assert (error.data["file"], error.data["line"], error.data["column"]) == ("main.rs", 2, 22)
    assert any(span["text"] == '"three"' for span in error.data["spans"])
    assert b"E0308" in result.stderr
    assert backend.builds == builds  # the build phase never ran


async def test_fn_main_is_refused_before_compiling(backend: RustBackend) -> None:
    builds = backend.builds
    with pytest.raises(InvalidCode) as caught:
        await run(backend, 'fn main() { println!("hi"); }')
    assert caught.value.details["reason"] == "fnMain"
    assert backend.builds == builds  # refused before any build started


async def test_panic_gives_a_non_zero_exit(backend: RustBackend) -> None:
    result = await run(backend, PANICS)
    assert (result.status, result.reason, result.exit_code) == ("failed", "exit", 101)
    assert b"panicked" in result.stderr and b"boom" in result.stderr
    assert not result.has_value


async def test_second_identical_run_hits_the_build_cache(backend: RustBackend) -> None:
    # The cache is seen in its counters and the result's metadata, not in timings (speed is
    # bench/sandbox_bench.py's).
    source = unique(RUN_OK)
    cold = await run(backend, source, input={"n": 1})
    builds, hits = backend.builds, backend.cache_hits
    warm = await run(backend, source, input={"n": 2})
    assert cold.metadata is not None and not cold.metadata.warm
    assert warm.metadata is not None and warm.metadata.warm
    assert (backend.builds, backend.cache_hits) == (builds, hits + 1)
    assert warm.value == {"double": 4, "echo": {"n": 2}}


async def test_run_phase_timeout(backend: RustBackend) -> None:
    result = await run(backend, LOOPS, timeout_ms=500)
    assert (result.status, result.reason, result.exit_code) == ("failed", "timeout", 124)


async def test_compile_phase_timeout(tmp_path: Path) -> None:
    ok, why = rust_state()
    require("rust", ok, why)
    async with RustBackend(settings=host_rust_settings(), check_timeout_s=0.001) as quick:
        await quick.prepare()
        result = await run(quick, unique(RUN_OK))
    assert (result.status, result.reason) == ("failed", "timeout")
    assert "check phase" in result.diagnostics[0].message


async def test_cancel_during_run(backend: RustBackend) -> None:
    await run(backend, LOOPS, timeout_ms=100)  # build it first
    req = request(backend, LOOPS, timeout_ms=20_000)
    task = asyncio.create_task(collect(backend.execute(req, None)))
    await asyncio.sleep(0.5)
    assert await backend.cancel(req.exec_id)
    result = await task
    assert (result.status, result.reason) == ("cancelled", "killed")


async def test_capabilities_are_the_runners(backend: RustBackend) -> None:
    caps = backend.capabilities
    assert caps.languages == {ExecutionLanguage.RUST}
    assert caps.isolation == "namespace" and caps.supports_structured_output
    assert backend.default_policy.filesystem.mode == "workspaceReadWrite"


async def test_compiler_cannot_read_host_files(backend: RustBackend) -> None:
    # include_str! runs at compile time: the confined compiler sees no /etc/shadow, and the
    # diagnostics name only what the build itself has.
    source = (
        "fn run(_input: serde_json::Value) -> serde_json::Value "
        '{ serde_json::json!(include_str!("/etc/shadow")) }'
    )
    result = await run(backend, source)
    assert (result.status, result.reason) == ("failed", "compileFailed")
    assert b"root:" not in result.stderr
    assert any("/etc/shadow" in d.message for d in result.diagnostics), result.diagnostics
