"""The ``code_exec`` tool: a JSON schema, adk-code's statuses, and it never raises."""

from __future__ import annotations

import base64
import json
from collections.abc import AsyncIterator
from typing import Any

import msgspec
import pytest

from backends.code_tool import (
    CODE_EXEC_PARAMETERS,
    DEFAULT_TIMEOUT_SECS,
    LANGUAGES,
    STATUSES,
    CodeExecArguments,
    CodeTool,
    clamp_timeout,
    parse_arguments,
    tool_definition,
)
from hub.cli import main
from tests.backends import wat
from tests.backends.helpers import host_rust_settings
from tests.backends.rust.test_backend import rust_state
from tests.support.require import require

RESULT_KEYS = {
    "status",
    "language",
    "exit_code",
    "stdout",
    "stderr",
    "stdout_truncated",
    "stderr_truncated",
    "duration_ms",
    "diagnostics",
}


@pytest.fixture
async def tool() -> AsyncIterator[CodeTool]:
    async with CodeTool(rust=host_rust_settings()) as made:
        yield made


async def call(tool: CodeTool, **arguments: Any) -> dict[str, Any]:
    out = await tool.call(arguments)
    assert set(out) >= RESULT_KEYS, out
    assert out["status"] in STATUSES
    json.dumps(out)  # always plain JSON
    return out


def test_schema() -> None:
    schema = CODE_EXEC_PARAMETERS
    assert schema["required"] == ["language", "code"]
    assert schema["properties"]["language"]["enum"] == list(LANGUAGES)
    timeout = schema["properties"]["timeout_secs"]
    assert (timeout["minimum"], timeout["maximum"], timeout["default"]) == (1, 300, 30)
    assert tool_definition()["name"] == "code_exec"
    assert tool_definition("anthropic")["input_schema"] is schema
    assert tool_definition("openai")["function"]["parameters"] is schema
    with pytest.raises(ValueError):
        tool_definition("other")


def test_schema_and_parser_come_from_one_type() -> None:
    fields = [f.name for f in msgspec.structs.fields(CodeExecArguments)]
    assert list(CODE_EXEC_PARAMETERS["properties"]) == fields
    parsed, timeout = parse_arguments({"language": "shell", "code": "true", "timeout_secs": 2.2})
    assert (parsed.language, parsed.code, timeout) == ("shell", "true", 3)
    assert parse_arguments({"language": "shell", "code": "x"})[0].input is not None  # unset
    assert parse_arguments({"language": "rust", "code": "", "timeout_secs": None})[1] == 30
    for bad in ({"language": "shell"}, {"language": "shell", "code": "x", "other": 1}):
        with pytest.raises(ValueError):
            parse_arguments(bad)


@pytest.mark.parametrize(
    ("given", "expected"),
    [
        (None, DEFAULT_TIMEOUT_SECS),
        (0, 1),
        (-5, 1),
        (1, 1),
        (2.2, 3),
        (300, 300),
        (10_000, 300),
        (float("inf"), 300),
    ],
)
def test_timeout_is_clamped(given: Any, expected: int) -> None:
    assert clamp_timeout(given) == expected


@pytest.mark.parametrize("given", ["30", True, float("nan"), [1]])
def test_timeout_must_be_a_number(given: Any) -> None:
    with pytest.raises(ValueError):
        clamp_timeout(given)


def test_cli_prints_the_schema(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["tool-schema"]) == 0
    printed = json.loads(capsys.readouterr().out)
    assert printed == tool_definition()
    assert main(["tool-schema", "--parameters"]) == 0
    assert json.loads(capsys.readouterr().out) == CODE_EXEC_PARAMETERS
    assert main(["tool-schema", "--style", "openai"]) == 0
    assert json.loads(capsys.readouterr().out)["type"] == "function"


async def test_python_success_with_value(tool: CodeTool) -> None:
    out = await call(tool, language="python", code="print('hi')\ninput['a'] + 1", input={"a": 41})
    assert (out["status"], out["value"], out["stdout"], out["exit_code"]) == (
        "success",
        42,
        "hi\n",
        0,
    )


async def test_python_timeout(tool: CodeTool) -> None:
    out = await call(tool, language="python", code="while True:\n    pass", timeout_secs=0)
    assert out["status"] == "timeout" and 900 <= out["duration_ms"] < 5000


async def test_python_memory_exceeded(tool: CodeTool) -> None:
    out = await call(tool, language="python", code="x = []\nwhile True:\n    x.append('y' * 10**6)")
    assert out["status"] == "memory_exceeded"


async def test_python_compile_error_has_a_line(tool: CodeTool) -> None:
    out = await call(tool, language="python", code="x = 1\ndef f(:\n    pass")
    assert out["status"] == "compile_error"
    assert out["diagnostics"][0]["line"] == 2


async def test_python_exception_is_an_error(tool: CodeTool) -> None:
    out = await call(tool, language="python", code="1 / 0")
    assert out["status"] == "error" and "ZeroDivisionError" in out["stderr"]


async def test_javascript_and_typescript(tool: CodeTool) -> None:
    js = await call(
        tool,
        language="javascript",
        code="export default (input) => { console.log('hi'); return { sum: input.a + input.b }; };",
        input={"a": 1, "b": 2},
    )
    ok, why = (js["status"] != "error" or "unavailable" not in js["stderr"], js["stderr"])
    require("deno", ok, why)
    assert (js["status"], js["value"], js["stdout"], js["language"]) == (
        "success",
        {"sum": 3},
        "hi\n",
        "javascript",
    )
    ts = await call(
        tool,
        language="typescript",
        code="export default (input: { n: number }): number => input.n * 2;",
        input={"n": 21},
    )
    assert (ts["status"], ts["value"]) == ("success", 42)
    broken = await call(tool, language="typescript", code="export default (")
    assert broken["status"] == "compile_error"
    thrown = await call(tool, language="javascript", code="export default () => { throw 1; };")
    assert thrown["status"] == "error"
    looping = await call(
        tool, language="javascript", code="export default () => { for (;;) {} };", timeout_secs=1
    )
    assert looping["status"] == "timeout"


async def test_wasm_text_and_base64(tool: CodeTool) -> None:
    out = await call(tool, language="wasm", code=wat.HELLO)
    assert (out["status"], out["stdout"]) == ("success", "hello from wasi\n")
    binary = base64.b64encode(wat.wasm(wat.ECHO)).decode()
    echoed = await call(tool, language="wasm", code=binary, input={"k": [1]})
    assert echoed["value"] == {"k": [1]}
    broken = await call(tool, language="wasm", code="(module (func")
    assert broken["status"] == "compile_error"
    junk = await call(tool, language="wasm", code="not base64!")
    assert junk["status"] == "compile_error"
    grows = await call(tool, language="wasm", code=wat.GROW_MEMORY)
    assert grows["status"] == "memory_exceeded"
    loops = await call(tool, language="wasm", code=wat.INFINITE_LOOP, timeout_secs=1)
    assert loops["status"] == "timeout"


async def test_shell(tool: CodeTool) -> None:
    out = await call(tool, language="shell", code="cat; echo oops >&2; exit 3", input={"x": 1})
    assert (out["status"], out["exit_code"], out["stdout"], out["stderr"]) == (
        "error",
        3,
        '{"x":1}\n',
        "oops\n",
    )
    ok = await call(tool, language="shell", code="echo fine")
    assert (ok["status"], ok["stdout"]) == ("success", "fine\n")


@pytest.mark.parametrize(
    "arguments",
    [
        {"language": "cobol", "code": "DISPLAY 'HI'"},
        {"language": "python"},
        {"language": "python", "code": 42},
        {"language": "python", "code": "1", "timeout_secs": "soon"},
        {"language": "python", "code": "1", "extra": True},
        [],
        "not json {",
        None,
    ],
)
async def test_bad_arguments_are_an_error_result(tool: CodeTool, arguments: Any) -> None:
    out = await tool.call(arguments)
    assert out["status"] == "error" and out["error"]["code"] == "invalidArguments"
    assert out["diagnostics"][0]["level"] == "error"


async def test_arguments_as_json_text(tool: CodeTool) -> None:
    out = await tool.call('{"language": "python", "code": "6 * 7"}')
    assert out["value"] == 42


async def test_rust_statuses(tool: CodeTool) -> None:
    ok, why = rust_state()
    require("rust", ok, why)
    success = await call(
        tool,
        language="rust",
        code="fn run(i: serde_json::Value) -> serde_json::Value { serde_json::json!([i, 1]) }",
        input="x",
    )
    assert (success["status"], success["value"]) == ("success", ["x", 1])
    refused = await call(tool, language="rust", code="fn main() {}")
    assert refused["status"] == "compile_error" and refused["error"]["code"] == "invalidCode"
    broken = await call(
        tool,
        language="rust",
        code='fn run(i: serde_json::Value) -> serde_json::Value {\n    let x: u8 = "no";\n    i\n}',
    )
    assert broken["status"] == "compile_error"
    first = broken["diagnostics"][0]
    assert (first["code"], first["line"], first["column"]) == ("E0308", 2, 17)
    panics = await call(
        tool, language="rust", code="fn run(_: serde_json::Value) -> serde_json::Value { panic!() }"
    )
    assert (panics["status"], panics["exit_code"]) == ("error", 101)
