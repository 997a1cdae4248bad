"""The audit ops over real sockets (``checkpoint``, ``proof``, ``cosign``; docs/protocol.md,
"Audit") against a real ``agora serve``: the key it creates at first start, the checkpoints it
produces while serving, proofs checked with the hub's own RFC 9162 verifier *and* with the
independent reference verifier of tests/hub/core/rfc9162_reference.py, and the errors."""

from __future__ import annotations

import base64
import json
import sqlite3
import stat
import subprocess
import sys
import time

from hub.core.chain import canonical_bytes
from hub.core.checkpoint import (
    COSIGNATURE_V1,
    add_signatures,
    format_note,
    generate_signer,
    open_checkpoint,
    parse_note,
    parse_verifier_key,
)
from hub.core.events import Event, decode_event
from hub.core.merkle import check_consistency, check_inclusion, leaf_hash
from tests.hub.core import rfc9162_reference as ref
from tests.support.hub import HubProcess, StartHub
from tests.support.peer import Peer, message, peer
from tests.support.tokens import mint
from tests.support.waiting import wait_for


def hub_key(hub: HubProcess) -> str:
    """What ``agora checkpoint key`` prints for the hub's data directory."""
    argv = [sys.executable, "-m", "hub", "checkpoint", "key", "--data", str(hub.data_dir)]
    done = subprocess.run(argv, capture_output=True, text=True, timeout=120, check=True)
    return done.stdout.strip()


async def publish(p: Peer, workspace: str, count: int) -> None:
    for i in range(count):
        ack = await p.publish(workspace, message(f"m{i}"))
        assert ack["op"] == "ack", ack


async def stored_events(p: Peer, workspace: str, head: int) -> list[Event]:
    """The workspace's events as stored (the ``event`` frames of a subscription)."""
    reply = await p.call("subscribe", workspace=workspace, afterSeq=0)
    assert reply["op"] == "subscribed", reply
    frames = await p.events(workspace, head)
    await p.call("unsubscribe", workspace=workspace)
    return [decode_event(json.dumps(f).encode()) for f in frames]


def b64(hashes: list[str]) -> list[bytes]:
    return [base64.b64decode(h) for h in hashes]


async def test_serve_creates_the_key_and_signs_the_head_on_demand(hub: HubProcess) -> None:
    key_file = hub.data_dir / "checkpoint.key"
    assert key_file.exists()  # at first start, before any request
    assert stat.S_IMODE(key_file.stat().st_mode) == 0o600
    verifier = parse_verifier_key(hub_key(hub))
    async with peer(hub.url, mint()) as p:
        await publish(p, "audit", 7)
        reply = await p.call("checkpoint", workspace="audit")
        assert reply["op"] == "checkpoint", reply
        assert reply["workspace"] == "audit" and reply["size"] == 7
        checkpoint, _ = open_checkpoint(reply["note"], verifier, origin=f"{verifier.name}/audit")
        assert checkpoint.size == 7
        # Asked again with no new event: the same checkpoint (kept, not signed twice).
        assert (await p.call("checkpoint", workspace="audit"))["note"] == reply["note"]
        await publish(p, "audit", 1)
        moved = await p.call("checkpoint", workspace="audit")
        assert moved["size"] == 8 and moved["note"] != reply["note"]


async def test_checkpoints_are_produced_while_serving(start_hub: StartHub) -> None:
    hub = start_hub("[audit]\ncheckpoint_every_events = 3\ncheckpoint_every_ms = 600000\n")
    db = hub.data_dir / "agora.db"

    def kept() -> list[int]:
        with sqlite3.connect(db) as conn:
            rows = conn.execute(
                "SELECT size FROM checkpoints WHERE workspace = 'auto' ORDER BY size"
            ).fetchall()
        conn.close()
        return [int(size) for (size,) in rows]

    async with peer(hub.url, mint()) as p:
        await publish(p, "auto", 2)
        await publish(p, "auto", 2)
        # Nobody asked: the hub's Checkpointer signed one once 3 events were appended.
        await wait_for(lambda: kept() != [])
        assert all(size >= 3 for size in kept())


async def test_the_time_bound_produces_a_checkpoint(start_hub: StartHub) -> None:
    hub = start_hub("[audit]\ncheckpoint_every_events = 1000\ncheckpoint_every_ms = 50\n")
    db = hub.data_dir / "agora.db"

    def kept() -> list[int]:
        with sqlite3.connect(db) as conn:
            rows = conn.execute("SELECT size FROM checkpoints WHERE workspace = 't'").fetchall()
        conn.close()
        return [int(size) for (size,) in rows]

    async with peer(hub.url, mint()) as p:
        await publish(p, "t", 1)
        await wait_for(lambda: kept() == [1])


async def test_inclusion_and_consistency_proofs_check(hub: HubProcess) -> None:
    verifier = parse_verifier_key(hub_key(hub))
    async with peer(hub.url, mint()) as p:
        await publish(p, "pr", 5)
        small = await p.call("checkpoint", workspace="pr")
        await publish(p, "pr", 8)
        large = await p.call("checkpoint", workspace="pr")
        old, _ = open_checkpoint(small["note"], verifier)
        new, _ = open_checkpoint(large["note"], verifier)
        assert (old.size, new.size) == (5, 13)
        events = await stored_events(p, "pr", 13)

        consistency = await p.call("proof", workspace="pr", fromSize=5, toSize=13)
        assert consistency["op"] == "proof", consistency
        assert (consistency["fromSize"], consistency["toSize"]) == (5, 13)
        proof = b64(consistency["hashes"])
        check_consistency(5, 13, old.root, new.root, proof)
        ref.verify_consistency(5, 13, old.root, new.root, proof)

        for seq in (1, 7, 13):
            reply = await p.call("proof", workspace="pr", seq=seq, treeSize=13)
            assert (reply["seq"], reply["treeSize"]) == (seq, 13), reply
            path = b64(reply["hashes"])
            leaf = leaf_hash(canonical_bytes(events[seq - 1]))
            check_inclusion(seq - 1, 13, leaf, path, new.root)
            ref.verify_inclusion(seq - 1, 13, leaf, path, new.root)


async def test_proof_errors_come_from_the_one_table(hub: HubProcess) -> None:
    async with peer(hub.url, mint()) as p:
        await publish(p, "err", 3)
        cases = [
            ({"seq": 1, "treeSize": 4}, "notFound"),  # beyond the tree
            ({"fromSize": 1, "toSize": 9}, "notFound"),
            ({"seq": 3, "treeSize": 2}, "badRequest"),
            ({"fromSize": 3, "toSize": 2}, "badRequest"),
            ({"seq": 1, "treeSize": 3, "fromSize": 1}, "badRequest"),
            ({"seq": 1}, "badRequest"),
            ({}, "badRequest"),
            ({"seq": 0, "treeSize": 3}, "badRequest"),
        ]
        for fields, code in cases:
            reply = await p.call("proof", workspace="err", **fields)
            assert (reply["op"], reply["code"]) == ("error", code), (fields, reply)
        empty = await p.call("checkpoint", workspace="never-written")
        assert (empty["op"], empty["code"]) == ("error", "notFound")
    async with peer(hub.url, mint(workspaces=("other",))) as p:
        for op, fields in (("checkpoint", {}), ("proof", {"fromSize": 1, "toSize": 2})):
            reply = await p.call(op, workspace="err", **fields)
            assert (reply["op"], reply["code"]) == ("error", "forbidden"), reply


async def test_cosign_is_kept_and_served_with_the_checkpoint(hub: HubProcess) -> None:
    verifier = parse_verifier_key(hub_key(hub))
    witness = generate_signer("witness.example", COSIGNATURE_V1)
    async with peer(hub.url, mint()) as p:
        await publish(p, "co", 4)
        reply = await p.call("checkpoint", workspace="co")
        note = parse_note(reply["note"])
        signature = witness.sign(note.text, timestamp=int(time.time()))
        cosigned = format_note(add_signatures(note, [signature]))
        vkey = witness.verifier.vkey()
    async with peer(hub.url, mint(rights=("read",))) as reader:
        refused = await reader.call("cosign", workspace="co", cosignature=cosigned, key=vkey)
        assert (refused["op"], refused["code"]) == ("error", "forbidden"), refused
    async with peer(hub.url, mint()) as p:
        kept = await p.call("cosign", workspace="co", cosignature=cosigned, key=vkey)
        assert kept["op"] == "checkpoint" and kept["cosignatures"], kept
        served = await p.call("checkpoint", workspace="co")
        assert served["note"] == reply["note"]
        whole = served["note"] + served["cosignatures"]
        open_checkpoint(whole, verifier, witnesses=[witness.verifier])
        # A signature that does not verify with the key given is refused, not kept.
        other = generate_signer("witness.example", COSIGNATURE_V1)
        forged = format_note(add_signatures(note, [other.sign(note.text, timestamp=1)]))
        bad = await p.call("cosign", workspace="co", cosignature=forged, key=vkey)
        assert (bad["op"], bad["code"]) == ("error", "badRequest"), bad
        plain = await p.call("cosign", workspace="co", cosignature=cosigned, key=verifier.vkey())
        assert (plain["op"], plain["code"]) == ("error", "badRequest"), plain
        assert (await p.call("checkpoint", workspace="co"))["cosignatures"] == kept["cosignatures"]


def test_the_key_file_survives_a_restart(start_hub: StartHub) -> None:
    hub = start_hub()
    before = hub_key(hub)
    assert hub.terminate() == 0
    hub.restart()
    assert hub_key(hub) == before
