"""The one error table (hub/core/errors.py): error class <-> stable wire code <-> close code <->
A2A error <-> HTTP status, read both ways, and the same table in docs/protocol.md."""

from __future__ import annotations

import re

import pytest

from hub.core import errors
from hub.core.errors import (
    ERROR_TABLE,
    FATAL_CLOSES,
    AgoraError,
    BadRequest,
    CloseCode,
    ConfigError,
    IntegrityError,
    Internal,
    TooLarge,
    Unauthorized,
    closes_connection,
    error_class,
    error_row,
    is_known_code,
)
from tests.support.paths import DOCS_DIR

PROTOCOL = DOCS_DIR / "protocol.md"


def first_column(header: str) -> list[str]:
    """The first column of the docs/protocol.md table whose header row starts with ``header``."""
    table = PROTOCOL.read_text().split(f"\n{header}", 1)[1].split("\n\n", 1)[0]
    return re.findall(r"^\| `?(\w+)`? \|", table, re.MULTILINE)


def test_each_code_is_in_the_table_once() -> None:
    codes = [row.code for row in ERROR_TABLE]
    assert len(codes) == len(set(codes)), codes
    assert len({row.error for row in ERROR_TABLE}) == len(ERROR_TABLE)


@pytest.mark.parametrize("row", ERROR_TABLE, ids=lambda row: row.code)
def test_class_and_code_map_both_ways(row: errors.ErrorRow) -> None:
    assert is_known_code(row.code)
    assert error_row(row.code) is row
    assert error_class(row.code) is row.error
    assert closes_connection(row.error("boom")) == row.closes


def test_every_wire_error_class_has_its_row() -> None:
    """A new AgoraError subclass with a code of its own must get a row (else its code would be
    read back as ``internal``)."""
    classes = {
        value
        for value in vars(errors).values()
        if isinstance(value, type) and issubclass(value, AgoraError)
    }
    tabled = {row.error for row in ERROR_TABLE}
    codes = {row.code for row in ERROR_TABLE}
    for cls in classes - tabled - set(errors.CLIENT_VERDICTS):
        assert cls.code in codes, f"{cls.__name__}.code {cls.code!r} has no row"
    # Subclasses that reuse a code are read back as the tabled class, on purpose:
    assert error_class(IntegrityError.code) is Internal
    assert error_class(ConfigError.code) is BadRequest


def test_an_unknown_code_is_internal() -> None:
    assert not is_known_code("noSuchCode")
    assert error_class("noSuchCode") is Internal
    assert closes_connection(Internal("boom")) is None


def test_only_unauthorized_closes_the_connection() -> None:
    assert [row.code for row in ERROR_TABLE if row.closes is not None] == ["unauthorized"]
    assert closes_connection(Unauthorized("expired")) is CloseCode.UNAUTHORIZED


def test_fatal_closes_are_not_retried_and_raise_tabled_errors() -> None:
    expected = {
        CloseCode.UNAUTHORIZED: Unauthorized,
        CloseCode.POLICY: BadRequest,
        CloseCode.TOO_BIG: TooLarge,
    }
    assert dict(FATAL_CLOSES) == expected
    # Read from the table's close columns, not tabled again beside it:
    assert [(row.code, row.fatal_closes) for row in ERROR_TABLE if row.fatal_closes] == [
        ("badRequest", (CloseCode.POLICY,)),
        ("unauthorized", (CloseCode.UNAUTHORIZED,)),
        ("tooLarge", (CloseCode.TOO_BIG,)),
    ]
    # A bare close (no error frame) is not how the error is sent: sending one keeps the
    # connection open.
    assert closes_connection(BadRequest("x")) is None and closes_connection(TooLarge("x")) is None
    tabled = {row.error for row in ERROR_TABLE}
    assert set(FATAL_CLOSES.values()) <= tabled
    # A shutdown, an internal failure or a slow reader is worth reconnecting after.
    for retry in (CloseCode.SHUTDOWN, CloseCode.INTERNAL, CloseCode.TOO_SLOW):
        assert retry not in FATAL_CLOSES


def test_docs_list_the_same_codes_in_the_same_order() -> None:
    assert first_column("| code | when |") == [row.code for row in ERROR_TABLE]


def test_docs_list_every_close_code() -> None:
    listed = {int(code) for code in first_column("| code | meaning |")}
    assert {int(code) for code in CloseCode} <= listed


def test_each_code_has_its_http_status_client_faults_4xx() -> None:
    statuses = {row.code: row.http for row in ERROR_TABLE}
    assert statuses == {
        "badRequest": 400,
        "unauthorized": 401,
        "forbidden": 403,
        "notFound": 404,
        "conflict": 409,
        "tooLarge": 413,
        "rateLimited": 429,
        "busy": 429,
        "exists": 409,
        "unavailable": 503,
        "internal": 500,
    }
    for row in ERROR_TABLE:
        assert (400 <= row.http < 500) == issubclass(row.error, errors.ClientError), row


def test_docs_list_the_http_statuses_in_the_table_order() -> None:
    found = re.search(
        r"with\nHTTP ([\d, and\n]+) \(the table's `http` column\)", PROTOCOL.read_text()
    )
    assert found is not None
    assert [int(n) for n in re.findall(r"\d+", found[1])] == [row.http for row in ERROR_TABLE]
