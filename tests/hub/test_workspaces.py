"""The decide → append → evolve pipeline (hub/workspaces.py) over a real SQLite store."""

from __future__ import annotations

import asyncio
import tempfile
import uuid
from collections.abc import AsyncIterator, Sequence
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from hub.core.errors import AgoraError, BadRequest, Conflict, Forbidden, NotFound, TooLarge
from hub.core.events import (
    ArtifactPayload,
    ArtifactPublished,
    Completed,
    Event,
    FileWritten,
    FileWrittenPayload,
    MemberJoined,
    MemberPayload,
    MessagePayload,
    MessagePosted,
    NeedWork,
    WorkClaimed,
    WorkPublished,
    decode_event,
    encode_event,
)
from hub.core.records import AppendResult
from hub.core.validation import Limits
from hub.log.base import AppendItem
from hub.log.loading import rebuild_state
from hub.log.sqlite import SqliteEventStore
from hub.workspaces import Workspaces


@pytest.fixture
async def store(tmp_path: Path) -> AsyncIterator[SqliteEventStore]:
    async with SqliteEventStore(tmp_path / "agora.db", blobs_dir=tmp_path / "blobs") as s:
        yield s


def msg(text: str, id: str = "") -> MessagePosted:
    return MessagePosted(id=id, payload=MessagePayload(text=text))


def write(path: str, text: str, base_rev: int | None = None, id: str = "") -> FileWritten:
    return FileWritten(id=id, payload=FileWrittenPayload(path=path, text=text, base_rev=base_rev))


async def test_producer_is_the_authenticated_agent(store: SqliteEventStore) -> None:
    ws = Workspaces(store)
    r = await ws.publish(
        "w", [MessagePosted(producer="mallory", payload=MessagePayload())], producer="alice"
    )
    assert r.events[0].producer == "alice"
    assert r.events[0].seq == 1


async def test_concurrent_publishers_share_commits_and_stay_gapless(
    store: SqliteEventStore,
) -> None:
    ws = Workspaces(store)
    seen: list[int] = []
    ws.add_listener(lambda name, evs: seen.extend(e.seq for e in evs))
    results = await asyncio.gather(
        *(ws.publish("w", [msg(f"m{i}")], producer=f"a{i % 7}") for i in range(300))
    )
    assert sorted(r.events[0].seq for r in results) == list(range(1, 301))
    assert seen == list(range(1, 301))  # listeners see committed events in seq order
    state = await ws.state("w")
    assert state.seq == 300 and state.messages == 300
    assert (await store.verify("w")).ok


async def test_listeners_hear_a_commit_before_any_of_its_publishers_resumes(
    store: SqliteEventStore,
) -> None:
    """The listeners (the fan-out) hear a transaction's events as the store reports it, in
    one call per workspace's run, not as each publisher's task resumes after it: a
    subscriber does not wait for the publishers. A publish_many run and plain publishes, on
    two workspaces, in one transaction."""
    ws = Workspaces(store)
    store.hear_commits(ws.heard)  # (as the hub does)
    order: list[tuple[str, Any]] = []
    ws.add_listener(lambda name, evs: order.append(("heard", name, [e.seq for e in evs])))
    for workspace in ("w", "v"):
        await ws.publish(workspace, [msg("open")], producer="a")  # open: the fold is live
    order.clear()

    async def publisher(workspace: str, i: int) -> None:
        await ws.publish(workspace, [msg(f"m{i}")], producer="a")
        order.append(("resumed", workspace, i))

    async def pipelined() -> None:
        await ws.publish_many("w", [([msg("p0")], None), ([msg("p1")], None)], producer="b")
        order.append(("resumed", "w", "run"))

    await asyncio.gather(publisher("w", 0), pipelined(), publisher("v", 1), publisher("w", 2))
    heard = [entry for entry in order if entry[0] == "heard"]
    assert heard == [("heard", "w", [2, 3, 4, 5]), ("heard", "v", [2])]
    assert order[:2] == heard  # before any publisher resumed
    assert len(order) == 6
    state = await ws.state("w")
    assert state.seq == 5 and state.messages == 5


async def test_decide_runs_against_in_flight_batches(store: SqliteEventStore) -> None:
    """Two concurrent writes with the same baseRev: exactly one wins."""
    ws = Workspaces(store)
    await ws.publish("w", [write("a.txt", "v1", base_rev=0)], producer="a")
    outcomes = await asyncio.gather(
        ws.publish("w", [write("a.txt", "v2", base_rev=1)], producer="a"),
        ws.publish("w", [write("a.txt", "v3", base_rev=1)], producer="b"),
        return_exceptions=True,
    )
    assert sum(isinstance(o, Conflict) for o in outcomes) == 1
    state = await ws.state("w")
    assert state.files["a.txt"].rev == 2


async def test_ownership_rules(store: SqliteEventStore) -> None:
    ws = Workspaces(store)
    await ws.publish("w", [NeedWork(correlation_id="c1", payload={"x": 1})], producer="planner")
    await ws.publish("w", [WorkClaimed(correlation_id="c1")], producer="coder")
    with pytest.raises(Conflict):
        await ws.publish("w", [WorkClaimed(correlation_id="c1")], producer="intruder")
    with pytest.raises(Forbidden):
        await ws.publish("w", [WorkPublished(correlation_id="c1")], producer="intruder")
    await ws.publish("w", [Completed(correlation_id="c1")], producer="coder")
    assert (await ws.head("w")) == 3


async def test_expected_seq(store: SqliteEventStore) -> None:
    ws = Workspaces(store)
    await ws.publish("w", [msg("a")], producer="a", expected_seq=0)
    with pytest.raises(Conflict) as e:
        await ws.publish("w", [msg("b")], producer="a", expected_seq=0)
    assert e.value.details["head"] == 1


async def test_retry_returns_the_original_even_when_rules_would_refuse_it(
    store: SqliteEventStore,
) -> None:
    ws = Workspaces(store)
    first = await ws.publish("w", [write("a", "1", base_rev=0, id="e1")], producer="a")
    again = await ws.publish("w", [write("a", "1", base_rev=0, id="e1")], producer="a")
    assert again.duplicate and again.seqs == first.seqs
    assert (await ws.head("w")) == 1


async def test_retry_of_a_batch_that_passes_the_rules_does_not_fork_the_state(
    store: SqliteEventStore,
) -> None:
    ws = Workspaces(store)
    await ws.publish("w", [msg("hi", id="m1")], producer="a")
    again = await ws.publish("w", [msg("hi", id="m1")], producer="a")
    assert again.duplicate
    await ws.publish("w", [msg("next")], producer="a")
    state = await ws.state("w")
    assert state.messages == 2 and state.seq == 2
    assert state == await rebuild_state(store, "w")


async def test_in_flight_duplicate(store: SqliteEventStore) -> None:
    ws = Workspaces(store)
    a, b = await asyncio.gather(
        ws.publish("w", [msg("x", id="same")], producer="a"),
        ws.publish("w", [msg("x", id="same")], producer="a"),
    )
    assert a.seqs == b.seqs == [1]
    assert {a.duplicate, b.duplicate} == {False, True}
    await ws.publish("w", [msg("y")], producer="a")
    assert await ws.state("w") == await rebuild_state(store, "w")


async def test_a_batch_is_atomic(store: SqliteEventStore) -> None:
    ws = Workspaces(store)
    with pytest.raises(Conflict) as e:
        await ws.publish(
            "w", [write("a", "1", base_rev=0), write("a", "2", base_rev=0)], producer="a"
        )
    assert e.value.details["index"] == 1
    assert (await ws.head("w")) == 0


@pytest.mark.parametrize(
    ("drafts", "error"),
    [
        ([write("../x", "1")], BadRequest),
        ([MemberJoined(payload=MemberPayload(agent="x"))], Forbidden),
        ([FileWritten(payload=FileWrittenPayload(path="a", blob="0" * 64))], NotFound),
        ([write("big", "x" * 2000)], TooLarge),
        ([], BadRequest),
    ],
)
async def test_bad_input_writes_nothing(
    store: SqliteEventStore, drafts: Sequence[Event], error: type[Exception]
) -> None:
    ws = Workspaces(store, limits=Limits(max_file_bytes=1000))
    with pytest.raises(error):
        await ws.publish("w", drafts, producer="a")
    assert await store.head("w") is None


async def test_hub_kinds_are_allowed_when_trusted(store: SqliteEventStore) -> None:
    ws = Workspaces(store)
    r = await ws.publish(
        "w", [MemberJoined(payload=MemberPayload(agent="a"))], producer="a", trusted=True
    )
    assert r.seqs == [1]
    assert (await ws.state("w")).members["a"].present


async def test_large_content_moves_to_the_blob_store(store: SqliteEventStore) -> None:
    ws = Workspaces(store, limits=Limits(blob_threshold=10))
    r = await ws.publish("w", [write("big.txt", "y" * 100)], producer="a")
    p = r.events[0].payload
    assert isinstance(p, FileWrittenPayload)
    assert p.text is None and p.blob is not None and p.size == 100
    assert await store.blobs.get(p.blob) == b"y" * 100
    small = await ws.publish("w", [write("s.txt", "tiny")], producer="a")
    assert isinstance(small.events[0].payload, FileWrittenPayload)
    assert small.events[0].payload.text == "tiny" and small.events[0].payload.size == 4


async def test_another_writer_on_the_same_log_is_caught_up(tmp_path: Path) -> None:
    """A second hub process (or `agora append`) appending to the same database."""
    db = tmp_path / "agora.db"
    async with (
        SqliteEventStore(db, blobs_dir=tmp_path / "b") as s1,
        SqliteEventStore(db, blobs_dir=tmp_path / "b") as s2,
    ):
        ws1, ws2 = Workspaces(s1), Workspaces(s2)
        await ws1.publish("w", [write("a", "1", base_rev=0)], producer="a")
        await ws2.publish("w", [write("a", "2", base_rev=1)], producer="b")
        seen: list[int] = []
        ws1.add_listener(lambda name, evs: seen.extend(e.seq for e in evs))
        # ws1 still believes rev 1: the store refuses its append, it catches up and re-decides.
        with pytest.raises(Conflict):
            await ws1.publish("w", [write("a", "3", base_rev=1)], producer="a")
        r = await ws1.publish("w", [write("a", "3", base_rev=2)], producer="a")
        assert r.seqs == [3]
        assert seen == [2, 3]
        assert (await ws1.state("w")).files["a"].rev == 3


async def test_state_time_travel(store: SqliteEventStore) -> None:
    ws = Workspaces(store, snapshot_every=5)
    for i in range(12):
        await ws.publish("w", [write("f", str(i), id=str(uuid.uuid4()))], producer="a")
    await ws.aclose()
    past = await ws.state("w", at_seq=7)
    assert past.seq == 7 and past.files["f"].text == "6"
    assert (await ws.state("w")).files["f"].text == "11"


# -- decide before writing anything; the hub's own figures (issue 11) ---------------------------


def _blob_files(tmp_path: Path) -> list[Path]:
    return [p for p in (tmp_path / "blobs").rglob("*") if p.is_file()]


async def test_a_refused_publish_stores_no_blob(store: SqliteEventStore, tmp_path: Path) -> None:
    ws = Workspaces(store)
    await ws.publish("w", [write("a.txt", "v1")], producer="alice")
    big = "x" * (ws.limits.blob_threshold + 1)
    for i in range(5):
        with pytest.raises(Conflict):  # stale baseRev: refused by decide
            await ws.publish("w", [write("a.txt", f"{big}{i}", base_rev=7)], producer="alice")
        with pytest.raises(Forbidden):  # a hub-only kind after a big file: refused
            await ws.publish(
                "w",
                [write(f"b{i}.txt", big), MemberJoined(payload=MemberPayload(agent="x"))],
                producer="alice",
            )
    assert _blob_files(tmp_path) == []
    r = await ws.publish("w", [write("c.txt", big)], producer="alice")  # accepted: stored
    [blob] = _blob_files(tmp_path)
    assert blob.name.endswith(r.events[0].payload.blob[2:])


async def test_an_artifact_needs_a_stored_blob_and_gets_the_hubs_figures(
    store: SqliteEventStore,
) -> None:
    ws = Workspaces(store)
    missing = "0" * 64
    with pytest.raises(NotFound) as info:
        await ws.publish(
            "w", [ArtifactPublished(payload=ArtifactPayload(key="k", blob=missing))], producer="a"
        )
    assert info.value.details["field"] == "payload.blob"
    with pytest.raises(BadRequest):
        await ws.publish("w", [ArtifactPublished(payload=ArtifactPayload(key="k"))], producer="a")
    blob = await store.blobs.put(b"12345")
    lie = ArtifactPayload(key="k", blob=blob, size_bytes=10**18, sha256="f" * 64)
    with pytest.raises(NotFound):  # stored, but not for this workspace: a hash opens nothing
        await ws.publish("w", [ArtifactPublished(payload=lie)], producer="a")
    await store.blobs.grant("w", blob, 5, "a")  # what a commitBlob to "w" records
    assert await ws.stored_bytes("w") == 5  # the grant counts against the quota
    r = await ws.publish("w", [ArtifactPublished(payload=lie)], producer="a")
    assert await ws.stored_bytes("w") == 5  # once: now the artifact pays for it
    stored = r.events[0].payload
    assert stored.size_bytes == 5 and stored.sha256 == blob


async def test_an_event_over_max_event_bytes_once_stored_is_refused(
    store: SqliteEventStore,
) -> None:
    ws = Workspaces(store, limits=Limits(max_event_bytes=4096))
    with pytest.raises(TooLarge) as info:
        await ws.publish("w", [msg("x" * 4000)], producer="alice")
    assert info.value.details["limit"] == 4096 and info.value.details["index"] == 0
    assert (await ws.state("w")).seq == 0
    r = await ws.publish("w", [msg("x" * 3000)], producer="alice")
    stored = [ev async for ev in store.read("w")]
    assert len(encode_event(stored[0])) <= 4096 and r.events[0].seq == 1


# -- nothing accepted can break a reader (issue 11) --------------------------------------------

_leaves = (
    st.none()
    | st.booleans()
    | st.integers(-(2**70), 2**70)
    | st.floats(allow_nan=False)
    | st.text(max_size=30)
)
_values = st.recursive(
    _leaves,
    lambda inner: (
        st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=6), inner, max_size=4)
    ),
    max_leaves=20,
)


def _nest(depth: int, value: object) -> object:
    for _ in range(depth):
        value = [value]
    return value


# Any data, nested to around the depth limit; any text, some around the stored-event size.
_data = _values | st.builds(_nest, st.integers(0, 140), _values)
_text = st.none() | st.text(max_size=60) | st.integers(1_040_000, 1_050_000).map(lambda n: "x" * n)


@st.composite
def _hostile_drafts(draw: st.DrawFn) -> list[Event]:
    drafts: list[Event] = []
    for _ in range(draw(st.integers(1, 5))):
        if draw(st.booleans()):
            payload = MessagePayload(text=draw(_text), data=draw(_data))
            drafts.append(MessagePosted(producer="x", payload=payload))
        else:
            path = draw(st.text(min_size=1, max_size=12) | st.sampled_from(["a", "a/b", "a/b/c"]))
            drafts.append(write(path, draw(st.text(max_size=20))))
    return drafts


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(drafts=_hostile_drafts())
def test_nothing_the_hub_accepts_can_break_a_reader(drafts: list[Event]) -> None:
    """For any event a publish accepts (each refused draft must be a typed error): the log
    reads back, verifies, folds at every seq, survives export/import and a reopen (restart),
    and every stored event fits a frame a default reader accepts (``max_event_bytes``)."""
    asyncio.run(_accepted_events_are_readable(drafts))


async def _accepted_events_are_readable(drafts: list[Event]) -> None:
    limits = Limits()
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        async with SqliteEventStore(root / "a.db", blobs_dir=root / "blobs") as store:
            workspaces = Workspaces(store, limits=limits)
            for draft in drafts:
                try:
                    await workspaces.publish("w", [draft], producer="x")
                except AgoraError as e:
                    assert e.code in ("badRequest", "tooLarge", "conflict"), e
            stored = [e async for e in store.read("w")]
            assert (await store.verify("w")).ok
            for event in stored:
                assert len(encode_event(event)) <= limits.max_event_bytes
                await rebuild_state(store, "w", at_seq=event.seq)
        async with SqliteEventStore(root / "a.db", blobs_dir=root / "blobs") as reopened:
            assert [e async for e in reopened.read("w")] == stored
            assert (await Workspaces(reopened).state("w")).seq == len(stored)
        if stored:
            lines = [encode_event(e) for e in stored]  # what `agora export` writes
            async with SqliteEventStore(root / "b.db", blobs_dir=root / "blobs") as copy:
                assert await copy.import_events("w", [decode_event(b) for b in lines]) == len(
                    stored
                )
                assert (await copy.verify("w")).ok


def _mixed_batches() -> list[tuple[list[Event], int | None]]:
    """Pipelined publishes of every sort: accepted, stale, invalid, refused by the rules,
    a file write (which publish_many hands to publish), a retried id."""
    return [
        ([msg("a")], None),
        ([msg("b")], 0),  # stale expectedSeq
        ([msg("c"), msg("c2")], 2),
        ([write("f.txt", "x")], None),
        ([msg("d")], 5),  # right after the file
        ([], None),  # empty: invalid
        ([MemberJoined(payload=MemberPayload(agent="x"))], None),  # the hub's kind
        ([write("f.txt", "y", base_rev=99)], None),  # stale baseRev
        ([msg("e", id="e-1")], None),
        ([msg("e", id="e-1")], None),  # the same id again: its duplicate
        ([msg("x" * 5000)], None),  # over max_event_bytes
        ([msg("f")], None),
    ]


def _outcome(outcome: object) -> tuple[object, ...]:
    if isinstance(outcome, Exception):
        return (type(outcome).__name__, getattr(outcome, "details", {}).get("index"))
    assert isinstance(outcome, AppendResult)
    return ("ok", tuple(outcome.seqs), outcome.duplicate)


async def test_publish_many_answers_each_publish_as_publish_one_by_one(
    store: SqliteEventStore,
) -> None:
    ws = Workspaces(store, limits=Limits(max_event_bytes=4096))
    batches = _mixed_batches()
    await ws.publish("many", [msg("open")], producer="alice")
    await ws.publish("one", [msg("open")], producer="alice")
    together = await ws.publish_many("many", batches, producer="alice")
    alone: list[object] = []
    for drafts, expected_seq in batches:
        try:
            alone.append(
                await ws.publish("one", drafts, producer="alice", expected_seq=expected_seq)
            )
        except Exception as e:
            alone.append(e)
    assert [_outcome(o) for o in together] == [_outcome(o) for o in alone]
    assert [_outcome(o)[0] for o in together].count("ok") == 7
    many = [(e.seq, e.kind, e.producer) async for e in store.read("many")]
    one = [(e.seq, e.kind, e.producer) async for e in store.read("one")]
    assert many == one
    assert (await ws.state("many")).files.keys() == {"f.txt"}


async def test_publish_many_hands_a_run_to_the_store_as_one_group(
    store: SqliteEventStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    calls: list[int] = []
    append_many = store.append_many

    async def counted(workspace: str, items: Sequence[AppendItem]) -> Any:
        calls.append(len(items))
        return await append_many(workspace, items)

    monkeypatch.setattr(store, "append_many", counted)
    ws = Workspaces(store)
    await ws.publish("w", [msg("open")], producer="alice")
    submitted: asyncio.Future[None] = asyncio.get_running_loop().create_future()
    outcomes = await ws.publish_many(
        "w", [([msg(str(i))], None) for i in range(40)], producer="alice", submitted=submitted
    )
    assert calls == [40]  # one group, one wait
    assert submitted.done()
    assert [o.seqs for o in outcomes if not isinstance(o, Exception)] == [[i] for i in range(2, 42)]
    assert (await ws.state("w")).seq == 41


class FloodedStore(SqliteEventStore):
    """A store another node floods with messages: one lands right before every append that
    names the head it expects (a batch decided on the state), so that head is always gone."""

    flooded = 0
    claims: str | None = None  # flood with one claim of this work item instead, by bob

    async def _flood(self, workspace: str) -> None:
        self.flooded += 1
        if self.claims is not None:
            claim = WorkClaimed(correlation_id=self.claims, producer="bob")
            await super().append(workspace, [claim])
            self.claims = None
            return
        await super().append(workspace, [msg(f"flood {self.flooded}")])

    async def append(
        self,
        workspace: str,
        drafts: Sequence[Event],
        *,
        expected_seq: int | None = None,
        reads: frozenset[str] | None = None,
    ) -> AppendResult:
        if expected_seq is not None:
            await self._flood(workspace)
        return await super().append(workspace, drafts, expected_seq=expected_seq, reads=reads)

    async def append_many(
        self, workspace: str, items: Sequence[AppendItem]
    ) -> list[AppendResult | Exception]:
        if any(item.expected_seq is not None for item in items):
            await self._flood(workspace)
        return await super().append_many(workspace, items)


@pytest.mark.parametrize("pipelined", [False, True])
async def test_a_claim_is_not_refused_because_another_node_floods_the_workspace(
    tmp_path: Path, pipelined: bool
) -> None:
    # The claim's decision reads work items only: the store appends it after the messages
    # it was not decided on, in its own transaction, instead of refusing it until the
    # publish gives up (MAX_REDECIDE rounds of "the head moved"). Once its node has caught
    # up, the next claim is decided on the state the messages left, and lands the same way.
    async with FloodedStore(tmp_path / "agora.db", blobs_dir=tmp_path / "blobs") as store:
        ws = Workspaces(store)
        await ws.publish(
            "w", [NeedWork(correlation_id="a"), NeedWork(correlation_id="b")], producer="r"
        )
        assert store.flooded == 1  # the needWork moves read the state too
        for cid in ("a", "b"):
            claim = [WorkClaimed(correlation_id=cid)]
            if pipelined:
                [result] = await ws.publish_many("w", [(claim, None)], producer="alice")
                assert isinstance(result, AppendResult), result
            else:
                result = await ws.publish("w", claim, producer="alice")
            assert result.events[0].kind == "workClaimed"
        assert store.flooded == 3  # one round each: never decided again
        await ws.catch_up("w")  # the other node's messages, as its NOTIFY would bring them
        state = await ws.state("w")
        assert {c: state.work_items[c].owner for c in ("a", "b")} == {"a": "alice", "b": "alice"}
        log = [e.kind async for e in store.read("w")]
        assert (
            log == ["messagePosted", "needWork", "needWork"] + ["messagePosted", "workClaimed"] * 2
        )


async def test_a_claim_decided_before_another_nodes_claim_of_the_item_is_refused(
    tmp_path: Path,
) -> None:
    # The other kind of event that can come between: one the claim's decision read. The
    # store refuses the append, the node decides again on the log, and the rules refuse it.
    async with FloodedStore(tmp_path / "agora.db", blobs_dir=tmp_path / "blobs") as store:
        ws = Workspaces(store)
        await ws.publish("w", [NeedWork(correlation_id="a")], producer="r")
        store.claims = "a"
        with pytest.raises(Conflict) as refused:
            await ws.publish("w", [WorkClaimed(correlation_id="a")], producer="alice")
        assert refused.value.details.get("owner") == "bob"
        kinds = [(e.kind, e.producer) async for e in store.read("w")]
        assert kinds[-1] == ("workClaimed", "bob") and ("workClaimed", "alice") not in kinds
