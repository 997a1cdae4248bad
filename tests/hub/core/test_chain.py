"""The per-workspace hash chain (hub/core/chain.py)."""

from __future__ import annotations

import hashlib
from typing import Any

import msgspec
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from hub.core.chain import (
    GENESIS,
    ChainBreak,
    canonical_bytes,
    compute_hash,
    seal,
    sealed_as,
    verify_chain,
)
from hub.core.events import (
    AnyEvent,
    Event,
    FileWritten,
    FileWrittenPayload,
    MessagePayload,
    MessagePosted,
    NeedWork,
)
from tests.strategies import seal_all, valid_drafts, valid_histories

# Every envelope field and one nested payload field, each with a value that differs.
ENVELOPE_EDITS = {
    "id": "other",
    "workspace": "other",
    "seq": 99,
    "timestamp": 1,
    "producer": "mallory",
    "consumer": "mallory",
    "topic": "other",
    "correlation_id": "other",
    "causation_id": "other",
    "prev": "0" * 64,
}


def _history() -> list[Event]:
    return seal_all(
        [
            ("alice", NeedWork(correlation_id="w", payload={"a": 1})),
            ("bob", FileWritten(payload=FileWrittenPayload(path="f", text="x"))),
            ("alice", MessagePosted(payload=MessagePayload(text="hi"))),
            ("bob", MessagePosted(payload=MessagePayload(text="bye"))),
        ]
    )


def test_seal_sets_envelope_and_hash() -> None:
    ev = seal(
        MessagePosted(payload=MessagePayload(text="hi")),
        id="e1",
        workspace="ws",
        seq=1,
        position=7,
        timestamp=5,
        producer="alice",
        prev=GENESIS,
    )
    assert (ev.id, ev.workspace, ev.seq, ev.position, ev.timestamp, ev.producer) == (
        "e1",
        "ws",
        1,
        7,
        5,
        "alice",
    )
    assert ev.prev is None
    assert ev.hash == compute_hash(ev)
    # The documented formula: sha256(utf8(prev) + canonical bytes).
    assert ev.hash == hashlib.sha256(canonical_bytes(ev)).hexdigest()
    second = seal(
        MessagePosted(),
        id="e2",
        workspace="ws",
        seq=2,
        position=8,
        timestamp=6,
        producer="bob",
        prev=ev.hash,
    )
    assert second.prev == ev.hash
    assert second.hash == hashlib.sha256(ev.hash.encode() + canonical_bytes(second)).hexdigest()


def test_canonical_bytes_sort_keys_and_drop_hash_and_position() -> None:
    ev = _history()[1]
    raw = canonical_bytes(ev)
    assert b'"hash"' not in raw and b'"position"' not in raw
    assert b" " not in raw
    decoded = msgspec.json.decode(raw)
    assert list(decoded) == sorted(decoded)
    assert list(decoded["payload"]) == sorted(decoded["payload"])
    # position is store-specific: changing it keeps the hash
    moved = msgspec.structs.replace(ev, position=12345)
    assert compute_hash(moved) == ev.hash


@pytest.mark.parametrize("field", sorted(ENVELOPE_EDITS))
def test_tampering_with_any_envelope_field_changes_the_hash(field: str) -> None:
    ev = _history()[1]
    tampered = msgspec.structs.replace(ev, **{field: ENVELOPE_EDITS[field]})
    assert compute_hash(tampered) != ev.hash


def test_tampering_with_payload_or_kind_changes_the_hash() -> None:
    ev = _history()[1]
    assert isinstance(ev, FileWritten)
    for change in ({"text": "y"}, {"path": "g"}, {"base_rev": 0}, {"media_type": "a/b"}):
        tampered = msgspec.structs.replace(
            ev, payload=msgspec.structs.replace(ev.payload, **change)
        )
        assert compute_hash(tampered) != ev.hash, change
    other_kind = NeedWork(**{f: getattr(ev, f) for f in ENVELOPE_EDITS}, payload=None)
    assert compute_hash(other_kind) != ev.hash


@settings(max_examples=100)
@given(valid_histories(max_size=30), st.data())
def test_any_tampered_event_breaks_verification(history: list[Event], data: st.DataObject) -> None:
    assert verify_chain(history) == (len(history), None)
    if not history:
        return
    i = data.draw(st.integers(0, len(history) - 1))
    field = data.draw(st.sampled_from(["id", "timestamp", "producer", "topic", "consumer"]))
    edited = msgspec.structs.replace(history[i], **{field: ENVELOPE_EDITS[field]})
    if edited == history[i]:
        return
    tampered = [*history[:i], edited, *history[i + 1 :]]
    checked, err = verify_chain(tampered)
    assert checked == i
    assert err == ChainBreak(seq=i + 1, problem="hash does not match content")


def test_verify_finds_gap_duplicate_and_broken_link() -> None:
    h = _history()
    assert verify_chain(h) == (4, None)
    # gap: seq 3 missing
    checked, err = verify_chain([h[0], h[1], h[3]])
    assert checked == 2 and err == ChainBreak(seq=3, problem="gap before seq 4")
    # duplicate: seq 2 twice
    checked, err = verify_chain([h[0], h[1], h[1], h[2]])
    assert checked == 2 and err == ChainBreak(seq=2, problem="duplicate seq")
    # broken link: event 3 re-sealed onto a different prev (its own hash is consistent)
    relinked = seal(
        h[2],
        id=h[2].id,
        workspace="ws",
        seq=3,
        position=3,
        timestamp=h[2].timestamp,
        producer=h[2].producer,
        prev="f" * 64,
    )
    checked, err = verify_chain([h[0], h[1], relinked, h[3]])
    assert checked == 2 and err == ChainBreak(seq=3, problem="prev does not match previous hash")
    # a rewritten hash (content edited, hash recomputed) breaks the next link
    forged = msgspec.structs.replace(h[1], producer="mallory")
    forged = msgspec.structs.replace(forged, hash=compute_hash(forged))
    checked, err = verify_chain([h[0], forged, h[2], h[3]])
    assert checked == 2 and err is not None and err.seq == 3


def test_verify_resumes_after_a_seq() -> None:
    h = _history()
    assert verify_chain(h[2:], after_seq=2, prev=h[1].hash or "") == (2, None)
    checked, err = verify_chain(h[2:], after_seq=2, prev=GENESIS)
    assert checked == 0 and err is not None and err.problem.startswith("prev")


def _walk(
    events: list[Event], after_seq: int = 0, prev: str = GENESIS
) -> tuple[int, ChainBreak | None]:
    """The chain check written out from its definition, with :func:`compute_hash` (what the
    inlined loop of verify_chain must agree with on any damage)."""
    expected = after_seq + 1
    for count, ev in enumerate(events):
        if ev.seq != expected:
            problem = "duplicate seq" if ev.seq < expected else f"gap before seq {ev.seq}"
            return count, ChainBreak(seq=min(ev.seq, expected), problem=problem)
        if (ev.prev or GENESIS) != prev:
            return count, ChainBreak(seq=ev.seq, problem="prev does not match previous hash")
        if ev.hash != compute_hash(ev):
            return count, ChainBreak(seq=ev.seq, problem="hash does not match content")
        prev, expected = ev.hash, expected + 1
    return len(events), None


_DAMAGE = st.sampled_from(
    [
        "prev None",
        "prev empty",
        "prev other",
        "hash None",
        "hash empty",
        "hash other",
        "seq",
        "drop",
        "repeat",
        "swap",
        "rehash",
        "producer",
    ]
)


@settings(max_examples=300)
@given(valid_histories(max_size=30), st.data())
def test_verify_chain_agrees_with_the_event_by_event_definition(
    history: list[Event], data: st.DataObject
) -> None:
    page = list(history)
    for _ in range(data.draw(st.integers(0, 3))):
        if not page:
            break
        i = data.draw(st.integers(0, len(page) - 1))
        ev = page[i]
        match data.draw(_DAMAGE):
            case "prev None" | "prev empty" | "prev other" as d:
                page[i] = msgspec.structs.replace(
                    ev, prev={"prev None": None, "prev empty": ""}.get(d, "e" * 64)
                )
            case "hash None" | "hash empty" | "hash other" as d:
                page[i] = msgspec.structs.replace(
                    ev, hash={"hash None": None, "hash empty": ""}.get(d, "e" * 64)
                )
            case "seq":
                page[i] = msgspec.structs.replace(ev, seq=data.draw(st.integers(0, 40)))
            case "drop":
                del page[i]
            case "repeat":
                page.insert(i, ev)
            case "swap":
                j = data.draw(st.integers(0, len(page) - 1))
                page[i], page[j] = page[j], page[i]
            case "rehash":  # content edited and its hash recomputed: the next link breaks
                forged = msgspec.structs.replace(ev, producer="mallory")
                page[i] = msgspec.structs.replace(forged, hash=compute_hash(forged))
            case _:
                page[i] = msgspec.structs.replace(ev, producer="mallory")
    # Resume part way (as a later page of a walk does): after seq ``start`` of the history.
    start = data.draw(st.integers(0, min(len(page), len(history))))
    after, prev = (0, GENESIS) if start == 0 else (start, history[start - 1].hash or GENESIS)
    tail = page[start:]
    assert verify_chain(tail, after_seq=after, prev=prev) == _walk(tail, after, prev)
    assert verify_chain(iter(tail), after_seq=after, prev=prev) == _walk(tail, after, prev)


@given(
    valid_drafts(max_size=8, min_size=1),
    st.integers(0, 2**40),
    st.integers(1, 2**40),
    st.integers(0, 2**45),
    st.sampled_from([GENESIS, "ab" * 32]),
    st.booleans(),
)
def test_sealed_as_rebuilds_what_seal_made(
    drafts: list[tuple[str, Event]],
    seq: int,
    position: int,
    timestamp: int,
    prev: str,
    minted: bool,
) -> None:
    # What a worker of `agora serve --workers` rebuilds from the writer's answer (the seal's
    # values and hash, hub.log.handoff) is the event the writer sealed and stored, of the
    # draft as it reached the writer.
    for i, (producer, draft) in enumerate(drafts):
        draft = msgspec.structs.replace(draft, producer=producer, id="" if minted else f"c{i}")
        envelope: dict[str, Any] = {
            "id": draft.id or f"minted-{i}",
            "workspace": "ws",
            "seq": seq + i + 1,
            "position": position + i,
            "timestamp": timestamp,
            "prev": prev,
        }
        # The writer seals the draft as it crossed (JSON); the worker rebuilds from its own.
        crossed = msgspec.json.decode(msgspec.json.encode(draft), type=AnyEvent)
        stored = seal(crossed, producer=producer, **envelope)
        assert stored.hash is not None
        rebuilt = sealed_as(draft, hash=stored.hash, **envelope)
        assert rebuilt == stored
        assert msgspec.json.encode(rebuilt) == msgspec.json.encode(stored)
        prev = stored.hash
