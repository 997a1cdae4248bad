"""The store conformance suite: every :class:`EventStore` kind must pass it unchanged.

Written only against the interface (the kinds are in ``tests/hub/log/stores.py``, the fixtures
in conftest.py); the tamper tests use the kind's backdoor to damage a row, then observe through
the interface.

Import semantics (decided here, documented in ``SqliteEventStore.import_events``): an export
is the whole log of one workspace and is restored under the *same* workspace name into a
store where that workspace is empty; positions are re-assigned, everything hashed is kept.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable, Sequence
from typing import Any

import msgspec
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from hub.core.chain import verify_chain
from hub.core.errors import BadRequest, Conflict, IntegrityError, Unavailable
from hub.core.events import (
    COLLABORATION_KINDS,
    Event,
    FileWritten,
    FileWrittenPayload,
    MessagePayload,
    MessagePosted,
    NeedWork,
    WorkClaimed,
    decode_event,
    decode_events,
    encode_event,
)
from hub.core.records import JoinedPage, Snapshot
from hub.core.rules.decide import FILE_KINDS
from hub.log.base import AppendItem, EventStore
from tests.hub.log.stores import StoreKind, read_all_from


def msg(text: str = "hello", *, id: str = "", producer: str = "alice") -> MessagePosted:
    return MessagePosted(id=id, producer=producer, payload=MessagePayload(text=text))


async def read_everything(store: EventStore, workspace: str) -> list[Event]:
    return [e async for e in store.read(workspace)]


# -- appending -------------------------------------------------------------------------------


async def test_append_one_event_seals_it(store: EventStore) -> None:
    before = time.time_ns() // 1_000_000
    result = await store.append("ws", [msg("hi", producer="agent-1")])
    after = time.time_ns() // 1_000_000
    assert not result.duplicate
    assert result.workspace == "ws"
    (ev,) = result.events
    assert isinstance(ev, MessagePosted)
    assert ev.seq == 1 and result.seqs == [1]
    assert ev.workspace == "ws"
    assert ev.position >= 1
    assert before - 1000 <= ev.timestamp <= after + 1000
    assert ev.producer == "agent-1"
    assert ev.id and result.ids == [ev.id]
    assert ev.prev is None and ev.hash
    assert ev.payload.text == "hi"
    count, problem = verify_chain([ev])
    assert (count, problem) == (1, None)


async def test_batches_get_gapless_seqs_and_linked_hashes(store: EventStore) -> None:
    first = await store.append("ws", [msg(str(i)) for i in range(5)])
    second = await store.append("ws", [msg(str(i)) for i in range(3)])
    assert first.seqs == [1, 2, 3, 4, 5]
    assert second.seqs == [6, 7, 8]
    assert second.events[0].prev == first.events[-1].hash
    events = await read_everything(store, "ws")
    assert [e.seq for e in events] == list(range(1, 9))
    assert list(events) == [*first.events, *second.events]
    assert verify_chain(events)[1] is None


async def test_positions_follow_commit_order_across_workspaces(store: EventStore) -> None:
    results = []
    for i in range(6):
        results.append(await store.append(f"ws{i % 3}", [msg(str(i)), msg(str(i))]))
    positions = [e.position for r in results for e in r.events]
    assert positions == sorted(positions)
    assert len(set(positions)) == len(positions)
    assert [r.seqs for r in results[:3]] == [[1, 2]] * 3
    assert [r.seqs for r in results[3:]] == [[3, 4]] * 3


async def test_client_ids_are_kept_and_missing_ones_minted(store: EventStore) -> None:
    result = await store.append("ws", [msg(id="a-1"), msg(), msg(id="a-3"), msg()])
    ids = result.ids
    assert ids[0] == "a-1" and ids[2] == "a-3"
    assert ids[1] and ids[3] and len(set(ids)) == 4
    stored = await store.read_batch("ws")
    assert [e.id for e in stored] == ids


async def test_retry_with_the_same_ids_is_a_duplicate(store: EventStore) -> None:
    drafts = [msg("one", id="r-1"), msg("two", id="r-2")]
    first = await store.append("ws", drafts)
    await store.append("ws", [msg("other")])
    again = await store.append("ws", drafts)
    assert again.duplicate
    assert again.seqs == first.seqs == [1, 2]
    assert again.events == first.events
    # The retry also ignores a (now stale) expected_seq: the answer is the original one.
    stale = await store.append("ws", drafts, expected_seq=0)
    assert stale.duplicate and stale.seqs == [1, 2]
    head = await store.head("ws")
    assert head is not None and head.seq == 3
    assert len(await read_everything(store, "ws")) == 3


async def test_retry_of_a_single_event_is_a_duplicate(store: EventStore) -> None:
    first = await store.append("ws", [msg(id="solo")])
    again = await store.append("ws", [msg("changed text", id="solo")])
    assert again.duplicate and again.events == first.events


async def test_batch_mixing_written_and_new_ids_conflicts(store: EventStore) -> None:
    await store.append("ws", [msg(id="m-1")])
    with pytest.raises(Conflict) as info:
        await store.append("ws", [msg(id="m-1"), msg(id="m-2")])
    assert info.value.details["head"] == 1
    with pytest.raises(Conflict):
        await store.append("ws", [msg(id="m-1"), msg()])
    assert [e.id for e in await read_everything(store, "ws")] == ["m-1"]


async def test_ids_are_scoped_per_workspace(store: EventStore) -> None:
    a = await store.append("a", [msg(id="same")])
    b = await store.append("b", [msg(id="same")])
    assert not b.duplicate and a.events[0].workspace == "a" and b.events[0].workspace == "b"


async def test_expected_seq(store: EventStore) -> None:
    ok = await store.append("ws", [msg()], expected_seq=0)
    assert ok.seqs == [1]
    ok = await store.append("ws", [msg(), msg()], expected_seq=1)
    assert ok.seqs == [2, 3]
    with pytest.raises(Conflict) as info:
        await store.append("ws", [msg()], expected_seq=1)
    assert info.value.details["head"] == 3
    with pytest.raises(Conflict) as info:
        await store.append("fresh", [msg()], expected_seq=4)
    assert info.value.details["head"] == 0
    assert len(await read_everything(store, "ws")) == 3
    assert await store.head("fresh") is None


async def test_empty_batch_and_repeated_ids_are_bad_requests(store: EventStore) -> None:
    with pytest.raises(BadRequest):
        await store.append("ws", [])
    with pytest.raises(BadRequest):
        await store.append("ws", [msg(id="x"), msg(id="x")])
    with pytest.raises(BadRequest):
        await store.append("bad name!", [msg()])
    assert await store.head("ws") is None


async def test_a_failing_request_does_not_fail_its_neighbours(store: EventStore) -> None:
    await store.append("ws", [msg(id="taken")])
    outcomes = await asyncio.gather(
        store.append("ws", [msg()]),
        store.append("ws", [msg()], expected_seq=0),  # stale
        store.append("ws", [msg(id="taken"), msg(id="new")]),  # mixed
        store.append("other", [msg()]),
        store.append("ws", [msg(id="taken")]),  # duplicate
        return_exceptions=True,
    )
    assert not isinstance(outcomes[0], BaseException) and outcomes[0].seqs == [2]
    assert isinstance(outcomes[1], Conflict)
    assert isinstance(outcomes[2], Conflict)
    assert not isinstance(outcomes[3], BaseException) and outcomes[3].seqs == [1]
    assert not isinstance(outcomes[4], BaseException) and outcomes[4].duplicate
    assert [e.seq for e in await read_everything(store, "ws")] == [1, 2]


async def test_append_many_answers_each_append_as_if_alone(store: EventStore) -> None:
    # A connection's pipelined publishes reach the store as one group: every item keeps its
    # own checks, expected_seq, ids and outcome, in order, and one refused fails alone.
    await store.append("ws", [msg(id="taken")])
    outcomes = await store.append_many(
        "ws",
        [
            AppendItem([msg()], None),
            AppendItem([msg()], 0),  # stale
            AppendItem([msg(id="x"), msg(id="x")], None),  # an id repeated: refused by the checks
            AppendItem([msg()], 2),  # right after the first item
            AppendItem([msg(id="taken"), msg(id="new")], None),  # mixed
            AppendItem([msg(id="taken")], None),  # duplicate
            AppendItem([], None),  # empty
            AppendItem([msg(id="fresh")], None),
        ],
    )
    assert len(outcomes) == 8
    ok = [o for o in outcomes if not isinstance(o, Exception)]
    assert [o.seqs for o in ok] == [[2], [3], [1], [4]]
    assert ok[2].duplicate and not ok[0].duplicate and not ok[3].duplicate
    assert isinstance(outcomes[1], Conflict) and isinstance(outcomes[4], Conflict)
    assert isinstance(outcomes[2], BadRequest) and isinstance(outcomes[6], BadRequest)
    assert [e.seq for e in await read_everything(store, "ws")] == [1, 2, 3, 4]


async def test_a_batch_lands_after_events_of_kinds_it_was_not_decided_on(
    store: EventStore,
) -> None:
    # ``reads``: another writer's messages since the state a work-item move was decided on
    # cannot change that decision, so the store appends it after them, in the same
    # transaction that checks them; an event of a kind it read refuses it, as before.
    await store.append("ws", [WorkClaimed(correlation_id="c")])
    messages = await store.append("ws", [msg("a"), msg("b")])
    landed = await store.append(
        "ws", [WorkClaimed(correlation_id="d")], expected_seq=1, reads=COLLABORATION_KINDS
    )
    assert landed.seqs == [4] and landed.events[0].prev == messages.events[-1].hash
    with pytest.raises(Conflict) as refused:  # workClaimed at 4 is a kind it read
        await store.append("ws", [msg()], expected_seq=3, reads=COLLABORATION_KINDS)
    assert refused.value.details["head"] == 4
    with pytest.raises(Conflict):  # without reads: any event since refuses it
        await store.append("ws", [msg()], expected_seq=3)
    with pytest.raises(Conflict):  # a head it has not seen yet
        await store.append("ws", [msg()], expected_seq=9, reads=FILE_KINDS)
    assert [e.seq for e in await read_everything(store, "ws")] == [1, 2, 3, 4]
    assert (await store.append("ws", [msg()], expected_seq=1, reads=FILE_KINDS)).seqs == [5]


async def test_reads_counts_what_the_same_batch_appended_before(store: EventStore) -> None:
    # An earlier request of the same transaction is past the stored head too: its kinds
    # count against a later request's reads exactly as stored events do.
    await store.append("ws", [msg()])
    outcomes = await store.append_many(
        "ws",
        [
            AppendItem([WorkClaimed(correlation_id="c")]),
            AppendItem([msg("refused")], 1, COLLABORATION_KINDS),
            AppendItem([msg("after it")], 1, FILE_KINDS),
        ],
    )
    assert isinstance(outcomes[1], Conflict)
    assert [o.seqs for o in outcomes if not isinstance(o, Exception)] == [[2], [3]]


async def test_append_many_lands_contiguously_among_other_appends(store: EventStore) -> None:
    # Other callers' appends never come between two items of one group (the order of a
    # group is the one its caller decided), whoever queued first.
    group = [AppendItem([msg(f"g{i}")]) for i in range(50)]
    others = [store.append("ws", [msg(f"o{i}")]) for i in range(20)]
    results = await asyncio.gather(*others[:10], store.append_many("ws", group), *others[10:])
    outcomes = results[10]
    assert isinstance(outcomes, list)
    seqs = [o.seqs[0] for o in outcomes if not isinstance(o, Exception)]
    assert len(seqs) == 50 and seqs == list(range(seqs[0], seqs[0] + 50))
    assert [e.seq for e in await read_everything(store, "ws")] == list(range(1, 71))


async def test_commit_listeners_hear_each_transaction_before_its_callers_resume(
    store: EventStore,
) -> None:
    """``hear_commits``: each transaction's new events, in log order, heard before any of
    its callers resumes; a duplicate answer is not heard again, a refused append not at all;
    a listener that raises is logged and the next one still hears."""
    order: list[tuple[str, Any]] = []

    def broken(_: Sequence[Any]) -> None:
        raise RuntimeError("a broken listener")

    store.hear_commits(broken)
    store.hear_commits(lambda appended: order.append(("heard", [r.seqs for r in appended])))

    async def caller(i: int, expected_seq: int | None = None) -> None:
        try:
            await store.append("ws", [msg(f"m{i}", id=f"id-{i}")], expected_seq=expected_seq)
        except Conflict:
            order.append(("refused", i))
            return
        order.append(("resumed", i))

    # Queued in one loop iteration: one transaction (the writer drains its queue).
    await asyncio.gather(*(caller(i) for i in range(3)))
    heard = [entry for entry in order if entry[0] == "heard"]
    assert heard == [("heard", [[1], [2], [3]])]
    assert order[0] == heard[0] and set(order[1:]) == {("resumed", i) for i in range(3)}
    order.clear()
    await caller(1)  # a retry: answered duplicate, nothing new to hear
    await caller(9, expected_seq=0)  # stale: refused
    assert order == [("resumed", 1), ("refused", 9)]
    await caller(4)
    assert order[2:] == [("heard", [[4]]), ("resumed", 4)]


async def test_a_retry_queued_behind_its_original_is_a_duplicate(store: EventStore) -> None:
    drafts = [msg(id="twin-1"), msg(id="twin-2")]
    first, second = await asyncio.gather(store.append("ws", drafts), store.append("ws", drafts))
    assert not first.duplicate and second.duplicate
    assert first.events == second.events
    assert len(await read_everything(store, "ws")) == 2


async def test_200_concurrent_appends(store: EventStore) -> None:
    results = await asyncio.gather(
        *(store.append("ws", [msg(str(i), id=f"c-{i}")]) for i in range(200))
    )
    assert sorted(r.seqs[0] for r in results) == list(range(1, 201))
    events = await read_everything(store, "ws")
    assert [e.seq for e in events] == list(range(1, 201))
    assert {e.id for e in events} == {f"c-{i}" for i in range(200)}
    by_id = {r.ids[0]: r.events[0] for r in results}
    assert all(by_id[e.id] == e for e in events)
    assert (await store.verify("ws")).ok


async def test_two_writers_race_position_order_is_commit_order(store: EventStore) -> None:
    async def writer(workspace: str, n: int) -> list[Event]:
        out: list[Event] = []
        for i in range(n):
            out.extend((await store.append(workspace, [msg(str(i))] * (1 + i % 3))).events)
        return out

    a, b = await asyncio.gather(writer("alpha", 60), writer("beta", 60))
    everything = await read_all_from(store, len(a) + len(b), page=7)
    positions = [e.position for e in everything]
    assert positions == list(range(positions[0], positions[0] + len(everything)))
    assert len(everything) == len(a) + len(b)
    assert {e.id for e in everything} == {e.id for e in a + b}
    for ws, mine in (("alpha", a), ("beta", b)):
        seqs = [e.seq for e in everything if e.workspace == ws]
        assert seqs == list(range(1, len(mine) + 1))


# -- reading ---------------------------------------------------------------------------------


async def test_read_batch_ranges(store: EventStore) -> None:
    await store.append("ws", [msg(str(i)) for i in range(10)])
    await store.append("other", [msg("x")])

    def seqs(events: Sequence[Event]) -> list[int]:
        return [e.seq for e in events]

    assert seqs(await store.read_batch("ws")) == list(range(1, 11))
    assert seqs(await store.read_batch("ws", after_seq=7)) == [8, 9, 10]
    assert seqs(await store.read_batch("ws", after_seq=2, until_seq=5)) == [3, 4, 5]
    assert seqs(await store.read_batch("ws", after_seq=2, limit=3)) == [3, 4, 5]
    assert seqs(await store.read_batch("ws", after_seq=10)) == []
    assert seqs(await store.read_batch("nobody")) == []
    assert seqs([e async for e in store.read("ws", after_seq=4, until_seq=8, batch=2)]) == [
        5,
        6,
        7,
        8,
    ]


async def test_pages_read_ahead_in_order(store: EventStore) -> None:
    await store.append("ws", [msg(str(i)) for i in range(10)])

    async def pages(**kwargs: Any) -> list[list[int]]:
        return [[e.seq for e in page] async for page in store.pages("ws", **kwargs)]

    assert await pages(batch=4) == [[1, 2, 3, 4], [5, 6, 7, 8], [9, 10]]
    # A last full page is followed by an empty one (the walk cannot know it was the last).
    assert await pages(batch=5) == [[1, 2, 3, 4, 5], [6, 7, 8, 9, 10], []]
    assert await pages(after_seq=2, until_seq=7, batch=2) == [[3, 4], [5, 6], [7]]
    assert await pages(after_seq=10) == [[]]
    with pytest.raises(ValueError):
        await pages(batch=0)


async def test_pages_stopped_early_leave_no_read_running(store: EventStore) -> None:
    await store.append("ws", [msg(str(i)) for i in range(10)])
    before = asyncio.all_tasks()
    async with contextlib.aclosing(store.pages("ws", batch=2)) as pages:
        async for page in pages:
            assert [e.seq for e in page] == [1, 2]
            break
    assert asyncio.all_tasks() == before  # the read ahead was cancelled and awaited
    assert [e.seq for e in await store.read_batch("ws", after_seq=8)] == [9, 10]


async def test_read_raw_returns_the_stored_bytes(store: EventStore) -> None:
    result = await store.append("ws", [msg("a"), msg("b"), msg("c")])
    raw = await store.read_raw("ws", after_seq=1)
    assert [seq for seq, _ in raw] == [2, 3]
    assert [decode_event(body) for _, body in raw] == list(result.events[1:])
    assert all(isinstance(body, bytes) for _, body in raw)
    assert await store.read_raw("ws", after_seq=2, limit=1) == raw[1:]


async def test_read_joined_is_the_stored_bytes_as_one_array(store: EventStore) -> None:
    """The replay fold's page: the bodies read_raw gives, joined into one JSON array, with
    the count and last seq the store saw (after_seq itself for an empty page)."""
    await store.append("ws", [msg(str(i)) for i in range(6)])
    await store.append("other", [msg("x")])
    raw = await store.read_raw("ws")
    page = await store.read_joined("ws", after_seq=1, until_seq=4)
    assert page == JoinedPage(
        body=b"[" + b",".join(body for _, body in raw[1:4]) + b"]", count=3, last_seq=4
    )
    assert decode_events(page.body) == await store.read_batch("ws", after_seq=1, until_seq=4)
    assert (await store.read_joined("ws", after_seq=2, limit=2)).last_seq == 4
    assert await store.read_joined("ws", after_seq=6) == JoinedPage(b"[]", 0, 6)
    assert await store.read_joined("ws", limit=0) == JoinedPage(b"[]", 0, 0)
    assert await store.read_joined("nobody") == JoinedPage(b"[]", 0, 0)


async def test_joined_pages_read_ahead_like_pages(store: EventStore) -> None:
    await store.append("ws", [msg(str(i)) for i in range(10)])

    async def pages(**kwargs: Any) -> list[list[int]]:
        return [
            [e.seq for e in decode_events(page.body)]
            async for page in store.joined_pages("ws", **kwargs)
        ]

    assert await pages(batch=4) == [[1, 2, 3, 4], [5, 6, 7, 8], [9, 10]]
    assert await pages(batch=5) == [[1, 2, 3, 4, 5], [6, 7, 8, 9, 10], []]
    assert await pages(after_seq=2, until_seq=7, batch=2) == [[3, 4], [5, 6], [7]]
    with pytest.raises(ValueError):
        await pages(batch=0)
    before = asyncio.all_tasks()
    async with contextlib.aclosing(store.joined_pages("ws", batch=2)) as early:
        async for page in early:
            assert page.last_seq == 2
            break
    assert asyncio.all_tasks() == before  # the read ahead was cancelled and awaited


async def test_read_all_pages_by_position(store: EventStore) -> None:
    written: list[Event] = []
    for i in range(9):
        written.extend((await store.append(f"w{i % 2}", [msg(str(i))])).events)
    assert await read_all_from(store, len(written), page=4) == written
    tail = await read_all_from(store, 4, after=written[4].position, page=100)
    assert tail == written[5:]
    assert await store.read_all(after_position=written[-1].position) == []


async def test_lookup_ids(store: EventStore) -> None:
    result = await store.append("ws", [msg(id="k-1"), msg(id="k-2")])
    found = await store.lookup_ids("ws", ["k-2", "nope", "k-1"])
    assert found == {"k-1": result.events[0], "k-2": result.events[1]}
    assert await store.lookup_ids("other", ["k-1"]) == {}
    assert await store.lookup_ids("ws", []) == {}


async def test_head_heads_and_workspaces(store: EventStore) -> None:
    assert await store.head("b") is None
    assert await store.heads() == []
    await store.append("b", [msg(), msg()])
    last_a = (await store.append("a", [msg()])).events[-1]
    last_b = (await store.append("b", [msg()])).events[-1]
    head = await store.head("b")
    assert head is not None
    assert (head.workspace, head.seq, head.hash) == ("b", 3, last_b.hash)
    assert (head.timestamp, head.position) == (last_b.timestamp, last_b.position)
    heads = await store.heads()
    assert [(h.workspace, h.seq) for h in heads] == [("a", 1), ("b", 3)]
    assert heads[0].hash == last_a.hash and heads[0].timestamp == last_a.timestamp
    assert await store.workspaces() == ["a", "b"]


async def test_verify_a_healthy_log(store: EventStore) -> None:
    for i in range(5):
        await store.append("ws", [msg(str(i))] * 3)
    report = await store.verify("ws")
    assert report.ok and report.checked == 15 and report.head == 15
    empty = await store.verify("nobody")
    assert empty.ok and empty.checked == 0 and empty.head == 0
    upto = await store.verify("ws", until_seq=7)
    assert upto.ok and upto.checked == 7 and upto.head == 7


# -- import ----------------------------------------------------------------------------------


async def test_import_round_trip(
    store: EventStore, make_store: Callable[[str], EventStore]
) -> None:
    await store.append("noise", [msg("n")])
    for i in range(4):
        await store.append("ws", [msg(str(i)), msg(str(i), producer="bob")])
    exported = await read_everything(store, "ws")

    async with make_store("restored") as other:
        await other.append("first", [msg("takes position 1")])
        assert await other.import_events("ws", exported) == len(exported)
        restored = await read_everything(other, "ws")
        strip = msgspec.structs.replace
        assert [strip(e, position=0) for e in restored] == [strip(e, position=0) for e in exported]
        assert all(e.position > 1 for e in restored)
        assert (await other.verify("ws")).ok
        # The restored chain continues normally.
        nxt = await other.append("ws", [msg("after import")])
        assert nxt.seqs == [len(exported) + 1] and nxt.events[0].prev == exported[-1].hash
        # A second import into the now non-empty workspace is refused.
        with pytest.raises(Conflict):
            await other.import_events("ws", exported)
        # Ids keep their idempotency after an import.
        again = await other.append("ws", [exported[0]])
        assert again.duplicate and again.seqs == [1]
        assert await other.import_events("empty", []) == 0


async def test_import_refuses_a_broken_chain(
    store: EventStore, make_store: Callable[[str], EventStore]
) -> None:
    await store.append("ws", [msg(str(i)) for i in range(6)])
    exported = await read_everything(store, "ws")
    edited = msgspec.structs.replace(exported[3], payload=MessagePayload(text="forged"))
    async with make_store("target") as other:
        with pytest.raises(IntegrityError) as info:
            await other.import_events("ws", [*exported[:3], edited, *exported[4:]])
        assert info.value.details["seq"] == 4
        with pytest.raises(IntegrityError) as info:
            await other.import_events("ws", exported[:2] + exported[3:])
        assert info.value.details["seq"] == 3
        with pytest.raises(IntegrityError):
            await other.import_events("ws", exported[1:])  # does not start at seq 1
        with pytest.raises(BadRequest):
            await other.import_events("elsewhere", exported)  # events name another workspace
        assert await other.head("ws") is None


# -- snapshots -------------------------------------------------------------------------------


async def test_snapshots(store: EventStore) -> None:
    for seq in (5, 10, 20):
        await store.save_snapshot(Snapshot("ws", "state", 1, seq, f"at {seq}".encode()))
    await store.save_snapshot(Snapshot("ws", "state", 2, 7, b"v2"))
    await store.save_snapshot(Snapshot("other", "state", 1, 3, b"o"))

    latest = await store.load_snapshot("ws", "state", 1)
    assert latest == Snapshot("ws", "state", 1, 20, b"at 20")
    mid = await store.load_snapshot("ws", "state", 1, at_or_before=19)
    assert mid is not None and mid.seq == 10 and mid.body == b"at 10"
    assert await store.load_snapshot("ws", "state", 1, at_or_before=4) is None
    assert await store.load_snapshot("ws", "other-name", 1) is None
    v2 = await store.load_snapshot("ws", "state", 2)
    assert v2 is not None and v2.body == b"v2"
    # Saving the same key again replaces it.
    await store.save_snapshot(Snapshot("ws", "state", 1, 20, b"again"))
    again = await store.load_snapshot("ws", "state", 1)
    assert again is not None and again.body == b"again"

    assert await store.delete_snapshots("ws") == 4
    assert await store.load_snapshot("ws", "state", 1) is None
    assert await store.load_snapshot("other", "state", 1) is not None
    assert await store.delete_snapshots() == 1
    assert await store.load_snapshot("other", "state", 1) is None


# -- lifecycle -------------------------------------------------------------------------------


async def test_close_waits_for_pending_appends(make_store: Callable[[str], EventStore]) -> None:
    store = make_store("closing")
    await store.open()
    tasks = [asyncio.create_task(store.append(f"w{i % 4}", [msg(str(i))])) for i in range(100)]
    await asyncio.sleep(0)  # every task has now queued its request
    await asyncio.gather(store.close(), store.close())  # concurrent closes share one shutdown
    results = [t.result() for t in tasks]  # all committed; none failed
    await store.close()  # idempotent
    with pytest.raises(Unavailable):
        await store.append("ws", [msg()])

    async with make_store("closing") as reopened:
        for w in range(4):
            events = await read_everything(reopened, f"w{w}")
            assert [e.seq for e in events] == list(range(1, 26))
        ids = {e.id for r in results for e in r.events}
        found = [e.id for ws in range(4) for e in await read_everything(reopened, f"w{ws}")]
        assert set(found) == ids


async def test_close_commits_appends_queued_behind_a_batch_being_written(
    make_store: Callable[[str], EventStore],
) -> None:
    # (Not only those of the batch the writer took before the close: a store that handed
    # its writes to another process failed the ones queued behind it.)
    store = make_store("behind")
    await store.open()
    first = asyncio.create_task(store.append("ws", [msg("0")]))
    for _ in range(3):
        await asyncio.sleep(0)  # the writer takes that batch and starts writing it
    later = [asyncio.create_task(store.append("ws", [msg(str(i))])) for i in range(1, 5)]
    await asyncio.sleep(0)  # queued behind it
    await store.close()
    assert [(await t).seqs for t in (first, *later)] == [[1], [2], [3], [4], [5]]


async def test_data_survives_reopening(make_store: Callable[[str], EventStore]) -> None:
    async with make_store("again") as store:
        first = await store.append("ws", [msg("a"), msg("b")])
    async with make_store("again") as store:
        assert await read_everything(store, "ws") == list(first.events)
        second = await store.append("ws", [msg("c")])
        assert second.seqs == [3] and second.events[0].prev == first.events[-1].hash
        assert second.events[0].position > first.events[-1].position
        assert (await store.verify("ws")).ok


async def test_cancelled_caller_does_not_break_the_store(store: EventStore) -> None:
    task = asyncio.create_task(store.append("ws", [msg(id="cancelled")]))
    await asyncio.sleep(0)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    # Whether or not that batch committed, a retry gives a consistent answer.
    retry = await store.append("ws", [msg(id="cancelled")])
    assert retry.seqs == [1]
    assert [e.id for e in await read_everything(store, "ws")] == ["cancelled"]


# -- tampering (through the kind's backdoor) -------------------------------------------------


async def test_verify_reports_an_edited_body(store: EventStore, store_kind: StoreKind) -> None:
    await store.append("ws", [msg(f"text {i}") for i in range(6)])
    store_kind.corrupt_body(store, "ws", 4, lambda b: b.replace(b"text 3", b"text X"))
    report = await store.verify("ws")
    assert not report.ok and report.error is not None
    assert report.error.seq == 4 and "hash" in report.error.problem
    assert report.checked == 3


async def test_verify_reports_a_deleted_event(store: EventStore, store_kind: StoreKind) -> None:
    await store.append("ws", [msg(f"text {i}") for i in range(6)])
    store_kind.delete_row(store, "ws", 3)
    report = await store.verify("ws")
    assert not report.ok and report.error is not None
    assert report.error.seq == 3 and "gap" in report.error.problem


async def test_an_undecodable_body_is_an_integrity_error(
    store: EventStore, store_kind: StoreKind
) -> None:
    await store.append("ws", [msg(f"text {i}") for i in range(3)])
    store_kind.corrupt_body(store, "ws", 2, lambda b: b[:-5])
    with pytest.raises(IntegrityError) as info:
        await store.read_batch("ws")
    assert info.value.details.get("seq") == 2


# -- property: random valid batches ----------------------------------------------------------

_text = st.text(st.characters(codec="utf-8", exclude_categories=["Cs"]), max_size=40)
_segment = st.text("abcdefghijklmnopqrstuvwxyz0123456789_-", min_size=1, max_size=8).filter(
    lambda s: s not in (".", "..")
)
_path = st.lists(_segment, min_size=1, max_size=4).map("/".join)
_json = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**53), 2**53) | _text,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(_segment, inner, max_size=3),
    max_leaves=8,
)
_producer = st.sampled_from(["alice", "bob", "runtime"])


@st.composite
def drafts(draw: st.DrawFn) -> Event:
    kind = draw(st.sampled_from(["message", "need", "file"]))
    producer = draw(_producer)
    topic = draw(st.none() | _segment)
    if kind == "message":
        return MessagePosted(
            producer=producer, topic=topic, payload=MessagePayload(text=draw(_text))
        )
    if kind == "need":
        return NeedWork(producer=producer, correlation_id=topic, payload=draw(_json))
    return FileWritten(
        producer=producer, payload=FileWrittenPayload(path=draw(_path), text=draw(_text))
    )


@st.composite
def batches(draw: st.DrawFn) -> list[tuple[str, list[Event]]]:
    """A sequence of (workspace, batch); each draft gets a unique id or none."""
    out: list[tuple[str, list[Event]]] = []
    counter = 0
    for _ in range(draw(st.integers(1, 8))):
        workspace = draw(st.sampled_from(["w1", "w2", "w3"]))
        batch: list[Event] = []
        for d in draw(st.lists(drafts(), min_size=1, max_size=6)):
            counter += 1
            if draw(st.booleans()):
                d = msgspec.structs.replace(d, id=f"id-{counter}")
            batch.append(d)
        out.append((workspace, batch))
    return out


_examples = 0


@settings(
    max_examples=50,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(plan=batches(), concurrent=st.booleans())
def test_random_batches_round_trip(
    make_store: Callable[[str], EventStore],
    plan: list[tuple[str, list[Event]]],
    concurrent: bool,
) -> None:
    # Each example gets fresh storage of its own (the fixture's tmp_path is shared).
    global _examples
    _examples += 1
    asyncio.run(_round_trip(make_store(f"example-{_examples}"), plan, concurrent))


async def _round_trip(
    store: EventStore, plan: list[tuple[str, list[Event]]], concurrent: bool
) -> None:
    async with store:
        if concurrent:
            results = await asyncio.gather(*(store.append(ws, b) for ws, b in plan))
        else:
            results = [await store.append(ws, b) for ws, b in plan]
        returned: dict[str, list[Event]] = {}
        for (ws, batch), result in zip(plan, results, strict=True):
            assert not result.duplicate
            assert len(result.events) == len(batch)
            for draft, ev in zip(batch, result.events, strict=True):
                assert ev.kind == draft.kind and ev.producer == draft.producer
                assert ev.id == (draft.id or ev.id) and ev.id
                assert _payload(ev) == _payload(draft)
            returned.setdefault(ws, []).extend(result.events)
        for ws, mine in returned.items():
            stored = await read_everything(store, ws)
            assert sorted(stored, key=lambda e: e.seq) == stored
            assert [e.seq for e in stored] == list(range(1, len(stored) + 1))
            assert sorted(mine, key=lambda e: e.seq) == stored
            assert verify_chain(stored)[1] is None
            assert all(decode_event(encode_event(e)) == e for e in stored)
            raw = await store.read_raw(ws, limit=10_000)
            assert [decode_event(b) for _, b in raw] == stored
        everything = await store.read_all(limit=10_000)
        assert [e.position for e in everything] == sorted({e.position for e in everything})


def _payload(event: Any) -> Any:
    return event.payload
