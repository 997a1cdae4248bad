"""a2a_adapter/errors.py: every hub error becomes the A2A error class the core's one table
names; ``data.agoraCode`` keeps the hub's code; a client error keeps its message and details,
a server error tells the peer to retry and keeps its details (a quarantine's reason, a path)
to the hub's log."""

from __future__ import annotations

import pytest
from a2a.utils import errors as a2a_errors

from a2a_adapter.errors import a2a_error, error_data
from hub.core.errors import ERROR_TABLE, ErrorRow, Forbidden, IntegrityError, Unavailable


@pytest.mark.parametrize("row", ERROR_TABLE, ids=lambda row: row.code)
def test_each_code_becomes_the_class_its_table_row_names(row: ErrorRow) -> None:
    mapped = a2a_error(row.error("boom"))
    assert type(mapped) is getattr(a2a_errors, row.a2a)
    assert isinstance(mapped.data, dict) and mapped.data["agoraCode"] == row.code


def test_a_client_error_keeps_its_message_and_details() -> None:
    mapped = a2a_error(Forbidden("workspace 'w' is not yours", field="workspace"))
    assert isinstance(mapped, a2a_errors.InvalidParamsError)
    assert mapped.message == "workspace 'w' is not yours"
    assert mapped.data == {"agoraCode": "forbidden", "field": "workspace"}


def test_a_server_error_keeps_its_details_to_the_hub() -> None:
    quarantined = Unavailable("workspace 'w' is quarantined", quarantined="IntegrityError: …")
    mapped = a2a_error(quarantined)
    assert isinstance(mapped, a2a_errors.InternalError)
    assert mapped.message == "the hub failed; retry"
    assert mapped.data == {"agoraCode": "unavailable"} == error_data(quarantined)
    damaged = a2a_error(IntegrityError("stored event at seq 2 cannot be decoded", seq=2))
    assert isinstance(damaged, a2a_errors.InternalError)
    assert damaged.data == {"agoraCode": "internal"}
