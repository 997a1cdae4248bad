"""rustc's JSON diagnostics (``--error-format=json``), parsed. Pure.

rustc writes one JSON object per line on stderr. :func:`parse_diagnostics` keeps the
diagnostics (level, message, code, spans with file/line/column and the highlighted text, the
rendered text) and skips every line that is not one: blank lines, other JSON (artifact
notifications), lines that do not parse (adk-code's rule: a bad line never fails the parse).
"""

from __future__ import annotations

from typing import Any, Final, Literal

import msgspec

from hub.core.execution.result import Diagnostic

__all__ = ["RustDiagnostic", "RustSpan", "errors", "parse_diagnostics", "to_diagnostic"]

_decoder: Final = msgspec.json.Decoder()

RustLevel = Literal["error", "warning", "note", "help", "failure-note", "ice"]


class RustSpan(msgspec.Struct, frozen=True, kw_only=True, rename="camel", omit_defaults=True):
    """Where a diagnostic points: 1-based lines and columns (end column exclusive) and the
    highlighted source text."""

    file: str
    line: int
    column: int
    end_line: int
    end_column: int
    primary: bool = False
    text: str = ""
    label: str | None = None


class RustDiagnostic(msgspec.Struct, frozen=True, kw_only=True, rename="camel", omit_defaults=True):
    """One compiler message."""

    level: RustLevel
    message: str
    code: str | None = None
    spans: list[RustSpan] = []
    children: list[str] = []
    rendered: str | None = None

    @property
    def is_error(self) -> bool:
        return self.level in ("error", "ice")

    @property
    def primary_span(self) -> RustSpan | None:
        return next((s for s in self.spans if s.primary), self.spans[0] if self.spans else None)


def _level(raw: object) -> RustLevel | None:
    if not isinstance(raw, str):
        return None
    if raw.startswith("error: internal compiler error"):
        return "ice"
    if raw in ("error", "warning", "note", "help", "failure-note"):
        return raw  # type: ignore[return-value]
    return None


def _span(raw: Any) -> RustSpan | None:
    if not isinstance(raw, dict):
        return None
    try:
        line, column = int(raw["line_start"]), int(raw["column_start"])
        end_line, end_column = int(raw["line_end"]), int(raw["column_end"])
    except (KeyError, TypeError, ValueError):
        return None
    highlighted: list[str] = []
    for part in raw.get("text") or []:
        if not isinstance(part, dict) or not isinstance(part.get("text"), str):
            continue
        start, end = part.get("highlight_start"), part.get("highlight_end")
        if isinstance(start, int) and isinstance(end, int) and start >= 1:
            highlighted.append(part["text"][start - 1 : end - 1])
    label = raw.get("label")
    return RustSpan(
        file=str(raw.get("file_name", "")),
        line=line,
        column=column,
        end_line=end_line,
        end_column=end_column,
        primary=bool(raw.get("is_primary", False)),
        text="\n".join(highlighted),
        label=label if isinstance(label, str) else None,
    )


def _diagnostic(raw: Any) -> RustDiagnostic | None:
    if not isinstance(raw, dict):
        return None
    if raw.get("$message_type", "diagnostic") != "diagnostic":
        return None
    level = _level(raw.get("level"))
    message = raw.get("message")
    if level is None or not isinstance(message, str):
        return None
    code = raw.get("code")
    code_text = code.get("code") if isinstance(code, dict) else None
    spans = [s for s in (_span(x) for x in raw.get("spans") or []) if s is not None]
    children = [
        f"{c.get('level')}: {c.get('message')}"
        for c in raw.get("children") or []
        if isinstance(c, dict) and isinstance(c.get("message"), str)
    ]
    rendered = raw.get("rendered")
    return RustDiagnostic(
        level=level,
        message=message,
        code=code_text if isinstance(code_text, str) else None,
        spans=spans,
        children=children,
        rendered=rendered if isinstance(rendered, str) else None,
    )


def parse_diagnostics(output: str | bytes) -> list[RustDiagnostic]:
    """Every diagnostic in rustc's ``--error-format=json`` output, in order; other lines are
    skipped."""
    text = output.decode("utf-8", "replace") if isinstance(output, bytes) else output
    found: list[RustDiagnostic] = []
    for line in text.splitlines():
        line = line.strip()
        if not line.startswith("{"):
            continue
        try:
            raw = _decoder.decode(line)
        except msgspec.DecodeError:
            continue
        diagnostic = _diagnostic(raw)
        if diagnostic is not None:
            found.append(diagnostic)
    return found


def errors(diagnostics: list[RustDiagnostic]) -> list[RustDiagnostic]:
    """The errors among ``diagnostics``, without rustc's closing "aborting due to …" summary."""
    return [d for d in diagnostics if d.is_error and not d.message.startswith("aborting due to")]


def to_diagnostic(diagnostic: RustDiagnostic) -> Diagnostic:
    """A result :class:`~hub.core.execution.result.Diagnostic`: ``data`` holds the spans
    (camelCase),
    the children and the rendered text; ``line``/``column`` of the primary span are repeated
    at the top of ``data`` for convenience."""
    level: Literal["error", "warning", "note"] = (
        "error" if diagnostic.is_error else "warning" if diagnostic.level == "warning" else "note"
    )
    data: dict[str, Any] = {"spans": msgspec.to_builtins(diagnostic.spans)}
    primary = diagnostic.primary_span
    if primary is not None:
        data.update(file=primary.file, line=primary.line, column=primary.column)
    if diagnostic.children:
        data["children"] = diagnostic.children
    if diagnostic.rendered:
        data["rendered"] = diagnostic.rendered
    return Diagnostic(level=level, message=diagnostic.message, code=diagnostic.code, data=data)
