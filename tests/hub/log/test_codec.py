"""The one decoder of stored rows (hub/log/codec.py): a page in one call, a damaged row named,
a body stored as TEXT still decoded, heads from rows."""

from __future__ import annotations

import pytest

from hub.core.errors import IntegrityError
from hub.core.events import Event, MessagePayload, MessagePosted, encode_event
from hub.core.records import Head
from hub.log.codec import READ_MAX_DEPTH, as_bytes, decode_or_skip, decode_page, head_from_row
from tests.strategies import seal_all


def sealed(n: int) -> list[Event]:
    return seal_all(
        [("alice", MessagePosted(payload=MessagePayload(text=f"m{i}"))) for i in range(n)]
    )


def test_a_page_decodes_to_the_stored_events() -> None:
    events = sealed(3)
    bodies = [encode_event(e) for e in events]
    assert decode_page(bodies, [e.seq for e in events], "seq") == events
    assert decode_page([], [], "seq") == []


def test_a_body_stored_as_text_still_decodes() -> None:
    (event,) = sealed(1)
    text = encode_event(event).decode()
    assert as_bytes(text) == encode_event(event)
    assert decode_page([text], [1], "seq") == [event]


@pytest.mark.parametrize("key_name", ["seq", "position"])
def test_the_first_undecodable_row_is_named(key_name: str) -> None:
    bodies = [encode_event(e) for e in sealed(4)]
    bodies[2] = bodies[2].replace(b'"kind"', b'"kind', 1)  # no longer JSON
    bodies[3] = b"{}"  # also bad, but after the first
    with pytest.raises(IntegrityError) as damaged:
        decode_page(bodies, [10, 11, 12, 13], key_name)
    assert damaged.value.details == {key_name: 12}
    assert f"at {key_name} 12 cannot be decoded" in damaged.value.message


def test_a_head_from_a_row() -> None:
    row = ("ws", 7, "ab" * 32, "2026-01-01T00:00:00Z", 41)
    assert head_from_row(row) == Head(
        workspace="ws", seq=7, hash="ab" * 32, timestamp="2026-01-01T00:00:00Z", position=41
    )


def test_decode_or_skip_skips_a_damaged_or_too_deep_row_and_decodes_the_rest(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A scan past damaged rows (a dead node's executions and members): a row that does not
    decode, or nests deeper than readers accept, is None and logged with its seq; a good row
    (bytes or TEXT) decodes."""
    (event,) = sealed(1)
    body = encode_event(event)
    assert decode_or_skip(body, 1) == event
    assert decode_or_skip(body.decode(), 1) == event
    deep = b'{"kind":"messagePosted","payload":{"data":' + b"[" * (READ_MAX_DEPTH + 5)
    deep += b"]" * (READ_MAX_DEPTH + 5) + b"}}"
    assert decode_or_skip(deep, 7) is None
    assert decode_or_skip(b"{not json", 8) is None
    assert "seq 7" in caplog.text and "seq 8" in caplog.text
