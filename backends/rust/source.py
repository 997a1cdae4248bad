"""The Rust harness and the bounded source model (adk-code's ``harness`` module). Pure.

User code defines ``fn run(input: serde_json::Value) -> serde_json::Value``; the harness adds
``main``, which reads JSON from stdin (``Null`` when stdin is empty or not JSON), calls ``run``
and prints the returned value as compact JSON on the last stdout line (the result's ``value``).

:func:`validate_rust_source` refuses what the harness cannot wrap, before anything is compiled:
a ``fn main`` (the harness provides it) and crate-level attributes ``#![…]`` (they must come
first in a crate, which the harness is). Comments, string literals and char literals are
stripped first, so ``"fn main"`` in a string or ``// fn main`` in a comment is fine.
"""

from __future__ import annotations

import re
from typing import Final

from hub.core.execution.errors import InvalidCode

__all__ = [
    "HARNESS_TEMPLATE",
    "MAX_RUST_SOURCE_BYTES",
    "strip_comments_and_literals",
    "validate_rust_source",
    "wrap",
]

MAX_RUST_SOURCE_BYTES: Final = 256 * 1024

HARNESS_TEMPLATE: Final = """{user_code}

fn main() {{
    use std::io::Read as _;
    let mut __agora_stdin = String::new();
    let _ = std::io::stdin().read_to_string(&mut __agora_stdin);
    let __agora_input: serde_json::Value =
        serde_json::from_str(&__agora_stdin).unwrap_or(serde_json::Value::Null);
    let __agora_output: serde_json::Value = run(__agora_input);
    println!("{{}}", serde_json::to_string(&__agora_output).unwrap_or_else(|_| "null".to_string()));
}}
"""
"""The harness; the user's code comes first, so compiler line numbers are the user's lines.
(Output printed with ``print!`` and no final newline runs into the value's line.)"""

_FN_MAIN: Final = re.compile(r"\bfn\s+main\b")
_CRATE_ATTRIBUTE: Final = re.compile(r"#\s*!\s*\[")
_FN_RUN: Final = re.compile(r"\bfn\s+run\b")


def strip_comments_and_literals(source: str) -> str:
    """``source`` with comments removed and string/char literals emptied.

    Handles line comments, nested block comments, string literals with escapes, raw strings
    (``r"…"``, ``r#"…"#``, byte variants) and char literals (told apart from lifetimes).
    Newlines are kept so positions stay on the same line. An unterminated comment or literal
    runs to the end.
    """
    out: list[str] = []
    i, n = 0, len(source)
    while i < n:
        c = source[i]
        if source.startswith("//", i):
            end = source.find("\n", i)
            i = n if end < 0 else end
            continue
        if source.startswith("/*", i):
            depth, i = 1, i + 2
            while i < n and depth:
                if source.startswith("/*", i):
                    depth, i = depth + 1, i + 2
                elif source.startswith("*/", i):
                    depth, i = depth - 1, i + 2
                else:
                    if source[i] == "\n":
                        out.append("\n")
                    i += 1
            out.append(" ")
            continue
        raw = re.match(r"b?r(#*)\"", source[i:]) if c in "br" else None
        if raw is not None and (i == 0 or not (source[i - 1].isalnum() or source[i - 1] == "_")):
            closing = '"' + raw.group(1)
            end = source.find(closing, i + raw.end())
            stop = n if end < 0 else end + len(closing)
            out.append('""' + "\n" * source.count("\n", i, stop))
            i = stop
            continue
        if c == '"' or (c == "b" and source.startswith('b"', i)):
            i += 1 if c == '"' else 2
            newlines = 0
            while i < n and source[i] != '"':
                if source[i] == "\\":
                    i += 1
                if i < n and source[i] == "\n":
                    newlines += 1
                i += 1
            out.append('""' + "\n" * newlines)
            i += 1
            continue
        if c == "'":
            char = re.match(
                r"'(?:\\(?:x[0-9a-fA-F]{2}|u\{[0-9a-fA-F]{1,6}\}|.)|[^\\'\n])'", source[i:]
            )
            if char is not None:
                out.append("' '")
                i += char.end()
                continue
        out.append(c)
        i += 1
    return "".join(out)


def validate_rust_source(source: str) -> None:
    """Refuse source the harness cannot wrap (see the module docstring).

    Raises :class:`InvalidCode` (``details['reason']``: ``tooLarge``, ``empty``, ``fnMain``,
    ``crateAttribute``, ``noRun``).
    """
    if len(source.encode("utf-8", "surrogatepass")) > MAX_RUST_SOURCE_BYTES:
        raise InvalidCode(
            f"the source is larger than {MAX_RUST_SOURCE_BYTES} bytes", reason="tooLarge"
        )
    code = strip_comments_and_literals(source)
    if not code.strip():
        raise InvalidCode("the source is empty: define fn run", reason="empty")
    match = _FN_MAIN.search(code)
    if match is not None:
        raise InvalidCode(
            "the source must not define fn main: the harness provides it and calls "
            "fn run(input: serde_json::Value) -> serde_json::Value",
            reason="fnMain",
            line=code.count("\n", 0, match.start()) + 1,
        )
    match = _CRATE_ATTRIBUTE.search(code)
    if match is not None:
        raise InvalidCode(
            "crate attributes (#![...]) are not allowed: the source is wrapped in a harness",
            reason="crateAttribute",
            line=code.count("\n", 0, match.start()) + 1,
        )
    if _FN_RUN.search(code) is None:
        raise InvalidCode(
            "the source must define fn run(input: serde_json::Value) -> serde_json::Value",
            reason="noRun",
        )


def wrap(source: str) -> str:
    """The complete crate for ``source`` (call :func:`validate_rust_source` first)."""
    return HARNESS_TEMPLATE.format(user_code=source.rstrip("\n"))
