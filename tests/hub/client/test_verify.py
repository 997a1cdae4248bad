"""The verifying client (``connect(..., verify=True, checkpoint_key=…, witness_file=…)``)
against a real ``agora serve``, on both stores: it keeps the checkpoints it was shown, and a
hub restarted on a log rewritten behind its back (the chain re-hashed, the Merkle hashes and
kept checkpoints deleted, so the hub signs the forgery with its own key) is caught: tail
truncation, a middle rewrite, a reorder, a dropped event, and a fork shown to two clients.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from hub.checkpoints import load_key
from hub.client import connect
from hub.core.checkpoint import NoteVerifier, generate_signer, open_checkpoint
from hub.core.errors import BadRequest, ConfigError, TamperDetected
from hub.core.events import Event
from tests.hub.client.helpers import message
from tests.support.hub import HubProcess, HubStarter
from tests.support.postgres import drop_schemas, need_postgres, new_schema
from tests.support.tamper import Backdoor, forged

EVENTS = 10


@dataclass
class Site:
    """One hub on one store, the attacker's backdoor to it, and its public key."""

    starter: HubStarter
    hub: HubProcess
    door: Backdoor
    key: NoteVerifier
    schemas: list[str]
    """PostgreSQL schemas of this test (its own and its copies'), dropped after it."""

    def copy(self, data: Path) -> Backdoor:
        """A copy of all of the hub's data at ``data`` (what an attacker edits)."""
        other = self.door.copy(data)
        if other.schema is not None:
            self.schemas.append(other.schema)
        return other

    def start_on(self, door: Backdoor) -> HubProcess:
        """Another hub on ``door``'s data (a copy: same key, same secret)."""
        return self.starter.start(data_dir=door.data, args=door.serve_args())


@pytest.fixture(params=["sqlite", "postgres"])
def site(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Site]:
    schemas: list[str] = []
    door = Backdoor(tmp_path / "data")
    if request.param == "postgres":
        need_postgres()
        schemas.append(new_schema("t_verify"))
        door = Backdoor(tmp_path / "data", schemas[0])
    starter = HubStarter(tmp_path)
    try:
        hub = starter.start(data_dir=door.data, args=door.serve_args())
        yield Site(starter, hub, door, load_key(door.data).verifier, schemas)
    finally:
        starter.close()
        drop_schemas(schemas)


async def write_and_witness(site: Site, seen: Path) -> str:
    """Publish the events and take the checkpoint a verifying client keeps; its note."""
    async with connect(
        site.hub.url, site.hub.token(), verify=True, checkpoint_key=site.key, witness_file=seen
    ) as session:
        ws = session.workspace("ws")
        for i in range(EVENTS):
            await ws.publish(message(f"message {i + 1}"))
        shown = await ws.checkpoint()
        assert shown.verified and shown.size == EVENTS
        return shown.note


Attack = Callable[[list[Event]], list[Event]]


def truncate(events: list[Event]) -> list[Event]:
    return events[:-3]


def rewrite_middle(events: list[Event]) -> list[Event]:
    return [forged(e, "forged") if e.seq == 5 else e for e in events]


def reorder(events: list[Event]) -> list[Event]:
    out = list(events)
    out[3], out[4] = out[4], out[3]
    return out


def drop_middle(events: list[Event]) -> list[Event]:
    return [e for e in events if e.seq != 6]


@pytest.mark.parametrize("attack", [truncate, rewrite_middle, reorder, drop_middle])
async def test_a_rewritten_history_raises_tamper_detected(
    site: Site, tmp_path: Path, attack: Attack
) -> None:
    seen = tmp_path / "seen.json"
    before = await write_and_witness(site, seen)
    assert json.loads(seen.read_text())["checkpoints"]["ws"] == before
    assert site.hub.terminate() == 0
    events = [e for _, e in site.door.events("ws")]
    site.door.rewrite("ws", attack(events))
    site.hub.restart()
    async with connect(
        site.hub.url, site.hub.token(), verify=True, checkpoint_key=site.key, witness_file=seen
    ) as session:
        with pytest.raises(TamperDetected) as caught:
            await session.workspace("ws").checkpoint()
    error = caught.value
    assert error.code == "tamperDetected" and error.workspace == "ws"
    assert error.previous == before
    # Both are genuine checkpoints signed by the hub's key: together they are the proof.
    old, _ = open_checkpoint(error.previous, site.key)
    new, _ = open_checkpoint(error.current, site.key)
    assert old.size == EVENTS and (new.size, new.root) != (old.size, old.root)
    # What the client kept is unchanged: it still holds the history it was shown.
    assert json.loads(seen.read_text())["checkpoints"]["ws"] == before


async def test_an_untouched_log_grows_consistently(site: Site, tmp_path: Path) -> None:
    seen = tmp_path / "seen.json"
    before = await write_and_witness(site, seen)
    assert site.hub.terminate() == 0
    site.hub.restart()
    async with connect(
        site.hub.url, site.hub.token(), verify=True, checkpoint_key=site.key, witness_file=seen
    ) as session:
        ws = session.workspace("ws")
        assert (await ws.checkpoint()).note == before
        acks = [await ws.publish(message(f"more {i}")) for i in range(5)]
        grown = await ws.checkpoint()  # checked by a consistency proof from size 10
        assert grown.size == EVENTS + 5
        events = await ws.events()
        last = grown
        for event in (events[0], events[6], events[-1]):
            # (subscribing may add presence events: the checkpoint grows with the log)
            last = await ws.verify_inclusion(event)
            assert last.size >= grown.size
        assert acks[-1].seq == EVENTS + 5
    # The witness file holds the latest checkpoint checked.
    assert json.loads(seen.read_text())["checkpoints"]["ws"] == last.note


async def test_a_forked_history_shown_to_two_clients(site: Site, tmp_path: Path) -> None:
    """Two hubs on copies of one data directory (same key); one copy rewritten. A client
    of each is happy alone; a client that saw one and is shown the other raises, with both."""
    a_seen, b_seen = tmp_path / "a.json", tmp_path / "b.json"
    honest = await write_and_witness(site, a_seen)
    assert site.hub.terminate() == 0
    fork = site.copy(tmp_path / "fork")
    fork.rewrite("ws", rewrite_middle([e for _, e in fork.events("ws")]))
    site.hub.restart()
    forked_hub = site.start_on(fork)
    token = site.hub.token()
    async with connect(
        forked_hub.url, token, verify=True, checkpoint_key=site.key, witness_file=b_seen
    ) as session:
        shown_b = await session.workspace("ws").checkpoint()  # B has seen nothing else
    assert shown_b.size == EVENTS and shown_b.note != honest
    # The client of A is then shown B's history (or B's client A's): either way, caught.
    for url, seen, first, second in (
        (forked_hub.url, a_seen, honest, shown_b.note),
        (site.hub.url, b_seen, shown_b.note, honest),
    ):
        async with connect(
            url, token, verify=True, checkpoint_key=site.key, witness_file=seen
        ) as session:
            with pytest.raises(TamperDetected) as caught:
                await session.workspace("ws").checkpoint()
        assert (caught.value.previous, caught.value.current) == (first, second)


async def test_a_forged_event_fails_its_inclusion_proof(site: Site, tmp_path: Path) -> None:
    async with connect(
        site.hub.url, site.hub.token(), verify=True, checkpoint_key=site.key
    ) as session:
        ws = session.workspace("inc")
        for i in range(4):
            await ws.publish(message(f"m{i}"))
        events = await ws.events()
        # (at least 4: subscribing may have added a presence event since)
        assert (await ws.verify_inclusion(events[1])).size >= 4
        with pytest.raises(TamperDetected) as caught:
            await ws.verify_inclusion(forged(events[1], "not what was logged"))
        assert caught.value.details["seq"] == 2


async def test_a_checkpoint_of_another_key_is_refused(site: Site) -> None:
    key = generate_signer(site.key.name).verifier  # the same name, another key
    async with connect(site.hub.url, site.hub.token(), verify=True, checkpoint_key=key) as s:
        ws = s.workspace("k")
        await ws.publish(message("x"))
        with pytest.raises(TamperDetected, match="not its own"):
            await ws.checkpoint()


async def test_verify_arguments_are_checked(site: Site, tmp_path: Path) -> None:
    with pytest.raises(BadRequest):
        connect(site.hub.url, site.hub.token(), verify=True)
    with pytest.raises(BadRequest):
        connect(site.hub.url, site.hub.token(), witness_file=tmp_path / "w.json")
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"key": "someone+00000000+AAAA", "checkpoints": {}}))
    with pytest.raises(ConfigError):
        connect(site.hub.url, site.hub.token(), verify=True, checkpoint_key=site.key,
                witness_file=bad)  # fmt: skip
    async with connect(site.hub.url, site.hub.token()) as plain:
        ws = plain.workspace("plain")
        await ws.publish(message("x"))
        assert not (await ws.checkpoint()).verified
        with pytest.raises(BadRequest):
            await ws.verify_inclusion((await ws.events())[0])
