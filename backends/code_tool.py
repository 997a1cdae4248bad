"""``code_exec``: an LLM-facing tool over the execution backends (adk-code's ``CodeTool``).

The tool takes JSON arguments (:class:`CodeExecArguments`, whose JSON Schema is
:data:`CODE_EXEC_PARAMETERS` and whose parser is :func:`parse_arguments`: ``language`` — ``rust``,
``python``, ``javascript``, ``typescript``, ``wasm``, ``shell``; ``code``; ``input``;
``timeout_secs`` clamped to 1-300, default 30) and **never raises**: every outcome, including bad
arguments and refused code, is a JSON
object with adk-code's status vocabulary:

============== ==============================================================================
status         when
============== ==============================================================================
success        the program ran and exited 0 (``completed``)
compile_error  the code did not compile or was refused before compiling (``compileFailed``,
               ``invalidCode``: a Rust ``fn main``, a Python syntax error, bad WAT)
timeout        a phase ran out of time (``reason: timeout``)
memory_exceeded the memory cap was hit (``reason: memoryLimit``)
error          anything else: a non-zero exit, a panic, a trap, a refused request
============== ==============================================================================

Result fields: ``status``, ``language``, ``exit_code``, ``stdout``, ``stderr`` (UTF-8 text,
invalid bytes replaced), ``value`` (only when the program returned one), ``stdout_truncated``,
``stderr_truncated``, ``duration_ms``, ``diagnostics`` (each ``level``, ``message``, and when
known ``code``, ``line``, ``column``, ``file``, ``text``), and ``error`` (``code``,
``message``) when the request was refused.

Languages: ``rust`` → the ``rust`` backend (``input`` → ``run(input)``, ``value`` = its return);
``python`` → the pydantic-monty sandbox (``input`` bound as a variable, ``value`` = the last
expression); ``javascript``/``typescript`` → an ES module on the Deno sandbox (its default export
called with ``input``, ``value`` = what it returns); ``wasm`` → ``code`` is WebAssembly text
(compiled with ``wasmtime.wat2wasm``) or base64 of a binary module, a WASI command (``input`` as
JSON on stdin, ``value`` = last stdout line if JSON); ``shell`` → ``/bin/sh -c code`` on the
``process`` backend with the network disabled (``input`` as JSON on stdin).
"""

from __future__ import annotations

import base64
import binascii
import contextlib
import math
from collections.abc import Mapping
from pathlib import Path
from typing import Annotated, Any, Final, Literal

import msgspec

from backends.base import CodeExecutor, collect
from hub.core.execution.capabilities import ExecutionLanguage
from hub.core.execution.errors import ExecutionError
from hub.core.execution.request import UNSET, ExecutionRequest, GuestModule, Source
from hub.core.execution.result import ExecutionResult
from hub.core.execution.settings import RustSettings

__all__ = [
    "CODE_EXEC_DESCRIPTION",
    "CODE_EXEC_PARAMETERS",
    "DEFAULT_TIMEOUT_SECS",
    "LANGUAGES",
    "MAX_TIMEOUT_SECS",
    "MIN_TIMEOUT_SECS",
    "STATUSES",
    "CodeExecArguments",
    "CodeTool",
    "clamp_timeout",
    "parse_arguments",
    "tool_definition",
]

TOOL_NAME: Final = "code_exec"
LANGUAGES: Final = ("rust", "python", "javascript", "typescript", "wasm", "shell")
STATUSES: Final = ("success", "compile_error", "timeout", "memory_exceeded", "error")
MIN_TIMEOUT_SECS: Final = 1
MAX_TIMEOUT_SECS: Final = 300
DEFAULT_TIMEOUT_SECS: Final = 30

CODE_EXEC_DESCRIPTION: Final = (
    "Execute code in a sandbox and get its output as JSON. "
    "rust: define `fn run(input: serde_json::Value) -> serde_json::Value` (no `fn main`; "
    "std and serde_json only); the returned value comes back as `value`. "
    "python: a sandboxed Python subset; `input` is a variable, the last expression is "
    "`value`; read_file/write_file/list_files/delete_file reach the workspace; no network, "
    "no host files. javascript/typescript: an ES module run on Deno whose default export is "
    "called with `input` and returns `value`; `import { readFile, writeFile, listFiles, "
    'deleteFile } from "agora:workspace"` reaches the workspace; no network, no host files, no '
    "other imports. wasm: WebAssembly text or base64 binary of a WASI command module; input "
    "as JSON on stdin. shell: a /bin/sh command, no network. Statuses: success, "
    "compile_error, timeout, memory_exceeded, error."
)

ToolLanguage = Literal["rust", "python", "javascript", "typescript", "wasm", "shell"]


class CodeExecArguments(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """The tool's arguments: the one type both its JSON Schema (:data:`CODE_EXEC_PARAMETERS`)
    and its parser (:func:`parse_arguments`) come from."""

    language: Annotated[
        ToolLanguage,
        msgspec.Meta(description="How to run `code`."),
    ]
    code: Annotated[
        str,
        msgspec.Meta(
            description=(
                "The program: Rust source defining fn run, a Python snippet, a JavaScript or "
                "TypeScript ES module with a default export, WebAssembly text (or base64 of a "
                ".wasm binary), or a shell command."
            )
        ),
    ]
    input: Annotated[
        Any,
        msgspec.Meta(
            description=(
                "Any JSON value given to the program (Rust: run's argument; Python: the "
                "variable `input`; JavaScript/TypeScript: the default export's argument; "
                "wasm and shell: JSON on stdin)."
            )
        ),
    ] = UNSET
    timeout_secs: Annotated[
        float,
        msgspec.Meta(
            description=(
                f"Time limit in seconds, clamped to {MIN_TIMEOUT_SECS}-{MAX_TIMEOUT_SECS} "
                f"(default {DEFAULT_TIMEOUT_SECS})."
            ),
            extra_json_schema={"minimum": MIN_TIMEOUT_SECS, "maximum": MAX_TIMEOUT_SECS},
        ),
    ] = DEFAULT_TIMEOUT_SECS


_KEY_ORDER: Final = ("type", "enum", "minimum", "maximum", "default", "description")
_ADVERTISED: Final[dict[str, dict[str, Any]]] = {
    # The languages in the tool's order (msgspec sorts a Literal's values).
    "language": {"type": "string", "enum": list(LANGUAGES)},
    # Whole seconds in the range are advertised; the parser takes any number and clamps it
    # (a fraction rounds up) rather than refusing it, as the tool always has.
    "timeout_secs": {"type": "integer"},
}


def _arguments_schema() -> dict[str, Any]:
    """:class:`CodeExecArguments` as a self-contained JSON Schema object (no ``$defs``),
    keys in a stable reading order."""
    _, components = msgspec.json.schema_components((CodeExecArguments,))
    schema: dict[str, Any] = components[CodeExecArguments.__name__]
    properties = {}
    for name, generated in schema["properties"].items():
        prop = {**generated, **_ADVERTISED.get(name, {})}
        properties[name] = {key: prop[key] for key in _KEY_ORDER if key in prop}
    return {
        "type": "object",
        "properties": properties,
        "required": schema["required"],
        "additionalProperties": schema["additionalProperties"],
    }


CODE_EXEC_PARAMETERS: Final[dict[str, Any]] = _arguments_schema()
"""The JSON Schema (draft 2020-12 subset) of the tool's arguments."""


def parse_arguments(arguments: Any) -> tuple[CodeExecArguments, int]:
    """``arguments`` (a decoded JSON object) as :class:`CodeExecArguments`, and the timeout
    clamped (:func:`clamp_timeout`). Raises ``ValueError`` naming what is wrong."""
    if not isinstance(arguments, dict):
        raise ValueError("arguments must be a JSON object")
    if arguments.get("timeout_secs", 0) is None:  # null: the default, as when omitted
        arguments = {k: v for k, v in arguments.items() if k != "timeout_secs"}
    try:
        parsed = msgspec.convert(arguments, CodeExecArguments, strict=True)
    except msgspec.ValidationError as e:
        raise ValueError(str(e)) from e
    return parsed, clamp_timeout(parsed.timeout_secs)


def tool_definition(style: str = "plain") -> dict[str, Any]:
    """The tool's definition for an LLM API: ``plain`` (``name``, ``description``,
    ``parameters``), ``anthropic`` (``input_schema``) or ``openai`` (``{"type": "function",
    "function": {...}}``). Raises ``ValueError`` for another style."""
    if style == "plain":
        return {
            "name": TOOL_NAME,
            "description": CODE_EXEC_DESCRIPTION,
            "parameters": CODE_EXEC_PARAMETERS,
        }
    if style == "anthropic":
        return {
            "name": TOOL_NAME,
            "description": CODE_EXEC_DESCRIPTION,
            "input_schema": CODE_EXEC_PARAMETERS,
        }
    if style == "openai":
        return {"type": "function", "function": tool_definition("plain")}
    raise ValueError(f"unknown tool definition style {style!r}")


def clamp_timeout(value: object) -> int:
    """``timeout_secs`` clamped to 1-300; missing → 30. Raises ``ValueError`` for a
    non-number."""
    if value is None:
        return DEFAULT_TIMEOUT_SECS
    if isinstance(value, bool) or not isinstance(value, int | float) or math.isnan(value):
        raise ValueError("timeout_secs must be a number")
    if math.isinf(value):
        return MAX_TIMEOUT_SECS if value > 0 else MIN_TIMEOUT_SECS
    return max(MIN_TIMEOUT_SECS, min(MAX_TIMEOUT_SECS, math.ceil(value)))


class _BadArguments(Exception):
    pass


class CodeTool:
    """The ``code_exec`` tool (see the module docstring).

    ``backends``: a backend per tool language (``rust``, ``python``, ``javascript`` — which
    also runs ``typescript`` unless one is given for it —, ``wasm``, ``shell``);
    missing ones are created on first use with a 300 s timeout ceiling and closed by
    :meth:`aclose`. ``workdir``: the directory programs see as their workspace (default: none).
    ``rust``: the settings of a ``rust`` backend it creates (resolved by the caller, e.g.
    ``RustSettings().resolved(os.environ)``; default: the type's environment-free defaults).
    """

    name: Final = TOOL_NAME

    def __init__(
        self,
        backends: Mapping[str, CodeExecutor] | None = None,
        *,
        workdir: Path | None = None,
        identity: str | None = None,
        rust: RustSettings | None = None,
    ) -> None:
        self._given: dict[str, CodeExecutor] = dict(backends or {})
        self._rust = rust
        self._owned: dict[str, CodeExecutor] = {}
        self._workdir = workdir
        self._identity = identity
        self._calls = 0

    @property
    def definition(self) -> dict[str, Any]:
        return tool_definition()

    async def __aenter__(self) -> CodeTool:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        """Close the backends this tool created. Idempotent."""
        owned, self._owned = self._owned, {}
        for backend in owned.values():
            with contextlib.suppress(Exception):
                await backend.aclose()

    async def call(self, arguments: Any) -> dict[str, Any]:
        """Run the tool on ``arguments`` (a dict, or its JSON text). Never raises (except
        cancellation of the caller)."""
        language = None
        try:
            if isinstance(arguments, str | bytes):
                try:
                    arguments = msgspec.json.decode(arguments)
                except msgspec.DecodeError as e:
                    raise _BadArguments(f"arguments are not JSON: {e}") from e
            try:
                parsed, timeout_s = parse_arguments(arguments)
            except ValueError as e:
                raise _BadArguments(str(e)) from e
            language, code, given_input = parsed.language, parsed.code, parsed.input
            backend = await self._backend(language)
            request = self._request(language, code, given_input, timeout_s, backend)
            result = await collect(backend.execute(request, self._workdir))
            return _outcome(language, result)
        except _BadArguments as e:
            return _refused(language, "error", "invalidArguments", str(e))
        except ExecutionError as e:
            status = (
                "compile_error"
                if e.exec_code in ("invalidCode", "compileFailed")
                else ("timeout" if e.exec_code == "timeout" else "error")
            )
            return _refused(language, status, e.exec_code, e.message, e.details)
        except Exception as e:  # the tool never raises: an unexpected failure is data too
            return _refused(language, "error", "internal", f"{type(e).__name__}: {e}")

    async def _backend(self, language: str) -> CodeExecutor:
        if language in self._given:
            return self._given[language]
        if language == "typescript":  # one Deno backend runs both
            language = "javascript"
            if language in self._given:
                return self._given[language]
        if language not in self._owned:
            self._owned[language] = _default_backend(language, self._rust)
        backend = self._owned[language]
        await backend.start()
        return backend

    def _request(
        self,
        language: str,
        code: str,
        given_input: Any,
        timeout_s: int,
        backend: CodeExecutor,
    ) -> ExecutionRequest:
        self._calls += 1
        policy = backend.default_policy
        timeout_ms = min(timeout_s * 1000, policy.timeout_ms)
        common: dict[str, Any] = {
            "exec_id": f"code-exec-{id(self):x}-{self._calls}",
            "timeout_ms": timeout_ms,
            "policy": policy,
            "identity": self._identity,
        }
        if language == "shell":
            stdin = None if given_input is UNSET else msgspec.json.encode(given_input) + b"\n"
            return ExecutionRequest(
                language=ExecutionLanguage.COMMAND, payload=Source(code), stdin=stdin, **common
            )
        if language == "wasm":
            return ExecutionRequest(
                language=ExecutionLanguage.WASM,
                payload=GuestModule(_wasm_bytes(code)),
                input=given_input,
                **common,
            )
        lang = {
            "rust": ExecutionLanguage.RUST,
            "javascript": ExecutionLanguage.JAVASCRIPT,
            "typescript": ExecutionLanguage.TYPESCRIPT,
        }.get(language, ExecutionLanguage.PYTHON)
        return ExecutionRequest(language=lang, payload=Source(code), input=given_input, **common)


def _wasm_bytes(code: str) -> bytes:
    """WebAssembly text compiled to a binary, or base64 of a binary. Raises
    :class:`~hub.core.execution.errors.InvalidCode`."""
    from hub.core.execution.errors import InvalidCode

    text = code.strip()
    if text.startswith("(") or text.startswith(";;"):
        import wasmtime

        try:
            return bytes(wasmtime.wat2wasm(text))
        except wasmtime.WasmtimeError as e:
            raise InvalidCode(f"the WebAssembly text does not compile: {e}") from e
    try:
        return base64.b64decode(text, validate=True)
    except (binascii.Error, ValueError) as e:
        raise InvalidCode("wasm code must be WebAssembly text or base64 of a binary") from e


def _default_backend(language: str, rust: RustSettings | None) -> CodeExecutor:
    """A backend for ``language`` with a timeout ceiling of :data:`MAX_TIMEOUT_SECS`."""
    ceiling = MAX_TIMEOUT_SECS * 1000
    if language == "python":
        from backends.monty import PythonBackend

        made: CodeExecutor = PythonBackend("code-exec-python")
        return PythonBackend(
            "code-exec-python", policy=made.default_policy.replace(timeout_ms=ceiling)
        )
    if language == "javascript":
        from backends.javascript import JavaScriptBackend

        made = JavaScriptBackend("code-exec-javascript")
        return JavaScriptBackend(
            "code-exec-javascript", policy=made.default_policy.replace(timeout_ms=ceiling)
        )
    if language == "wasm":
        from backends.wasm import WasmBackend

        made = WasmBackend("code-exec-wasm")
        return WasmBackend("code-exec-wasm", policy=made.default_policy.replace(timeout_ms=ceiling))
    from backends.process import ProcessBackend
    from hub.core.execution.policy import FilesystemPolicy, SandboxPolicy

    # Confined (bubblewrap): no network, the workspace read-write at /workspace.
    process_policy = SandboxPolicy(
        filesystem=FilesystemPolicy.workspace_read_write(), timeout_ms=ceiling
    )
    if language == "shell":
        return ProcessBackend("code-exec-shell", policy=process_policy)
    from backends.rust import RustBackend

    return RustBackend("code-exec-rust", policy=process_policy, settings=rust)


def _text(data: bytes) -> str:
    return data.decode("utf-8", "replace")


def _status(result: ExecutionResult) -> str:
    if result.status == "completed":
        return "success"
    return {
        "compileFailed": "compile_error",
        "timeout": "timeout",
        "memoryLimit": "memory_exceeded",
    }.get(result.reason, "error")


def _diagnostic(d: Any) -> dict[str, Any]:
    out: dict[str, Any] = {"level": d.level, "message": d.message}
    if d.code:
        out["code"] = d.code
    if isinstance(d.data, dict):
        for key in ("file", "line", "column", "text"):
            if d.data.get(key) is not None:
                out[key] = d.data[key]
        spans = d.data.get("spans")
        if spans and isinstance(spans, list) and isinstance(spans[0], dict):
            primary = next((s for s in spans if s.get("primary")), spans[0])
            out.setdefault("text", primary.get("text"))
            out["end_line"] = primary.get("endLine")
            out["end_column"] = primary.get("endColumn")
    return out


def _outcome(language: str, result: ExecutionResult) -> dict[str, Any]:
    out: dict[str, Any] = {
        "status": _status(result),
        "language": language,
        "exit_code": result.exit_code,
        "stdout": _text(result.stdout),
        "stderr": _text(result.stderr),
        "stdout_truncated": result.stdout_truncated,
        "stderr_truncated": result.stderr_truncated,
        "duration_ms": result.duration_ms,
        "diagnostics": [_diagnostic(d) for d in result.diagnostics],
    }
    if result.has_value:
        out["value"] = result.value
    return out


def _refused(
    language: str | None,
    status: str,
    code: str,
    message: str,
    details: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    diagnostic: dict[str, Any] = {"level": "error", "code": code, "message": message}
    if details and isinstance(details.get("line"), int):
        diagnostic["line"] = details["line"]
    return {
        "status": status,
        "language": language,
        "exit_code": None,
        "stdout": "",
        "stderr": message + "\n",
        "stdout_truncated": False,
        "stderr_truncated": False,
        "duration_ms": 0,
        "diagnostics": [diagnostic],
        "error": {"code": code, "message": message},
    }
