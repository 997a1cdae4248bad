"""``agora checkpoint``, ``verify --checkpoint``, ``prove``, ``verify-proof`` and export/import
of checkpoints, run through ``hub.cli.main`` on real SQLite and PostgreSQL stores.

The attacks are made as someone holding the database would make them: on a copy of the
real data (SQLite: the file; PostgreSQL: the schema's rows), with SQL, re-hashing the whole
chain with the hub's own code so that ``agora verify`` alone still says ``ok`` (issue #13).
Only a checkpoint taken before the edit catches them.
"""

from __future__ import annotations

import io
import json
import re
import sys
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import asyncpg
import msgspec
import pytest

from hub.cli import main
from hub.core.chain import compute_hash
from hub.core.checkpoint import (
    COSIGNATURE_V1,
    add_signatures,
    format_note,
    generate_signer,
    parse_note,
)
from hub.core.events import Event, MessagePayload, decode_event, encode_event
from tests.support.postgres import POSTGRES_DSN, pg_run, postgres_unavailable
from tests.support.require import require
from tests.support.tamper import Backdoor

EVENTS = "".join(
    json.dumps({"kind": "messagePosted", "payload": {"text": f"message {i}"}}) + "\n"
    for i in range(1, 11)
)


class Site:
    """One hub's data (a data directory, and for PostgreSQL a schema) that the CLI runs on,
    plus the attacker's direct access to its rows."""

    def __init__(
        self, root: Path, kind: str, capsys: pytest.CaptureFixture[str], made: list[Site]
    ) -> None:
        root.mkdir()
        self.root = root
        self.kind = kind
        self.capsys = capsys
        self.data = root / "data"
        self.schema = f"t_audit_{uuid.uuid4().hex[:16]}"
        self.made = made  # every site of the test, whose schemas are dropped after it
        made.append(self)

    def new(self, name: str) -> Site:
        """Another hub, with data of its own."""
        return Site(self.root.parent / name, self.kind, self.capsys, self.made)

    def store_args(self) -> list[str]:
        args = ["--data", str(self.data)]
        if self.kind == "postgres":
            args += ["--store", f"{POSTGRES_DSN}?schema={self.schema}"]
        return args

    def __call__(self, *argv: str, stdin: str = "") -> tuple[int, str, str]:
        old = sys.stdin
        sys.stdin = io.TextIOWrapper(io.BytesIO(stdin.encode()))
        try:
            code = main([*argv, *self.store_args()])
        except SystemExit as e:
            code = int(e.code or 0)
        finally:
            sys.stdin = old
        out, err = self.capsys.readouterr()
        return code, out, err

    def ok(self, *argv: str, stdin: str = "") -> str:
        code, out, err = self(*argv, stdin=stdin)
        assert code == 0, err
        return out

    @property
    def backdoor(self) -> Backdoor:
        """The attacker's direct access to this hub's rows (tests/support/tamper.py)."""
        return Backdoor(self.data, self.schema if self.kind == "postgres" else None)

    def copy(self, name: str) -> Site:
        """A copy of all of this hub's data (what an attacker edits)."""
        other = self.new(name)
        copied = self.backdoor.copy(other.data)
        if copied.schema is not None:
            other.schema = copied.schema  # dropped with the test's other schemas
        return other

    def events(self, workspace: str) -> list[tuple[int, Event]]:
        """(position, event) of every stored event, in seq order."""
        return self.backdoor.events(workspace)

    def rewrite(self, workspace: str, events: list[Event], *, drop_hashes: bool = False) -> None:
        """Replace the workspace's log by ``events`` with the whole chain re-hashed (so the
        chain verifies); ``drop_hashes`` also deletes its stored Merkle hashes."""
        self.backdoor.rewrite(workspace, events, forget=("merkle_hashes",) if drop_hashes else ())


@pytest.fixture(params=["sqlite", "postgres"])
def site(
    request: pytest.FixtureRequest, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> Iterator[Site]:
    if request.param == "postgres":
        why = postgres_unavailable()
        require("postgres", why is None, why or "")
    made: list[Site] = []
    first = Site(tmp_path / "hub", request.param, capsys, made)
    try:
        first.ok("append", "ws", stdin=EVENTS)
        first.ok("checkpoint", "key")  # the key exists from the first start on
        yield first
    finally:
        if request.param == "postgres":
            names = [m.schema for m in made]

            async def drop(conn: asyncpg.Connection) -> None:
                for name in names:
                    await conn.execute(f'DROP SCHEMA IF EXISTS "{name}" CASCADE')

            pg_run(drop)


def checkpoint(site: Site, path: Path) -> Path:
    site.ok("checkpoint", "ws", "--out", str(path))
    return path


def assert_detected(site: Site, files: list[Path], first_seq: int | None) -> str:
    """``agora verify`` alone still says ok (the chain was re-hashed); with the checkpoint
    files it exits 1 naming the file that no longer holds and the first differing seq."""
    code, _, err = site("verify", "ws")
    assert code == 0, err
    code, out, err = site("verify", "ws", *[a for f in files for a in ("--checkpoint", str(f))])
    assert code == 1, out
    assert f"checkpoint {files[-1]} (size 10)" in err
    assert "no longer contains the tree it signed" in err
    if first_seq is not None:
        assert f"first differing seq {first_seq}" in err
    assert "FAILED" in out
    return err


def test_checkpoint_prints_a_signed_note_kept_in_the_store(site: Site, tmp_path: Path) -> None:
    out = site.ok("checkpoint", "ws")
    key = site.ok("checkpoint", "key").strip()
    name = key.split("+")[0]
    assert re.fullmatch(r"agora\.[0-9a-f]{8}\+[0-9a-f]{8}\+[A-Za-z0-9+/]{44}", key)
    lines = out.splitlines()
    assert lines[:2] == [f"{name}/ws", "10"]
    assert lines[3] == "" and lines[4].startswith(f"— {name} ")
    assert (site.data / "checkpoint.key").stat().st_mode & 0o777 == 0o600
    # Asking again without new events returns the checkpoint kept, not a new signature.
    assert site.ok("checkpoint", "ws") == out
    code, _, err = site("checkpoint", "nope")
    assert code == 1 and "notFound" in err


def test_an_untouched_log_holds_its_checkpoints(site: Site, tmp_path: Path) -> None:
    c10 = checkpoint(site, tmp_path / "c10")
    site.ok("append", "ws", stdin=EVENTS)
    c20 = checkpoint(site, tmp_path / "c20")
    out = site.ok("verify", "ws", "--checkpoint", str(c10), str(c20))
    assert f"ok checkpoint {c10}: ws still holds the tree of size 10" in out
    assert f"ok checkpoint {c20}: ws still holds the tree of size 20" in out
    key = tmp_path / "key"
    key.write_text(site.ok("checkpoint", "key"))
    site.ok("verify", "ws", "--checkpoint", str(c10), "--key", str(key))


def removed_rows_seq(site: Site, seq: int) -> int | None:
    """The first differing seq ``verify`` can tell once events were deleted, with no smaller
    checkpoint to go by: PostgreSQL keeps the stored hashes in a table of their own, which
    still holds the signed tree; SQLite keeps each event's hashes in its row (docs/audit.md,
    "Costs"), so deleted events took theirs along and only the detection remains."""
    return seq if site.kind == "postgres" else None


def test_tail_truncation_is_detected(site: Site, tmp_path: Path) -> None:
    c10 = checkpoint(site, tmp_path / "c10")
    forged = site.copy("forged")
    events = [e for _, e in forged.events("ws")]
    forged.rewrite("ws", events[:7])
    err = assert_detected(forged, [c10], removed_rows_seq(site, 8))
    assert "the log has 7 events but the checkpoint signed 10" in err


def test_a_middle_rewrite_with_the_whole_chain_re_hashed_is_detected(
    site: Site, tmp_path: Path
) -> None:
    site.ok("append", "early", stdin=EVENTS)
    c10 = checkpoint(site, tmp_path / "c10")
    forged = site.copy("forged")
    events = [e for _, e in forged.events("ws")]
    events[4] = msgspec.structs.replace(events[4], payload=MessagePayload(text="forged"))
    forged.rewrite("ws", events)
    assert_detected(forged, [c10], 5)


def test_a_rewrite_that_also_rebuilds_the_stored_hashes_is_still_detected(
    site: Site, tmp_path: Path
) -> None:
    c10 = checkpoint(site, tmp_path / "c10")
    forged = site.copy("forged")
    events = [e for _, e in forged.events("ws")]
    events[4] = msgspec.structs.replace(events[4], payload=MessagePayload(text="forged"))
    forged.rewrite("ws", events, drop_hashes=True)
    forged.ok("append", "ws", stdin=EVENTS[:60])  # the hub rebuilds the hashes of the forgery
    code, _, err = forged("verify", "ws", "--checkpoint", str(c10))
    assert code == 1 and "history was rewritten" in err
    # And the hub refuses to sign the forged history, inconsistent with what it signed.
    code, _, err = forged("checkpoint", "ws")
    assert code == 1 and "no longer contains the tree of size 10" in err


def test_a_reorder_is_detected(site: Site, tmp_path: Path) -> None:
    c3 = checkpoint_at(site, tmp_path, 3)
    c10 = checkpoint(site, tmp_path / "c10")
    forged = site.copy("forged")
    events = [e for _, e in forged.events("ws")]
    events[5], events[6] = events[6], events[5]
    forged.rewrite("ws", events)
    err = assert_detected(forged, [c3, c10], 6)
    assert f"checkpoint {c3}" not in err  # the earlier tree is intact


def test_a_dropped_middle_event_is_detected(site: Site, tmp_path: Path) -> None:
    c10 = checkpoint(site, tmp_path / "c10")
    forged = site.copy("forged")
    events = [e for _, e in forged.events("ws")]
    forged.rewrite("ws", events[:3] + events[4:])
    assert_detected(forged, [c10], removed_rows_seq(site, 4))


def test_a_truncation_below_a_checkpoint_that_holds_names_the_first_seq(
    site: Site, tmp_path: Path
) -> None:
    """With a smaller checkpoint still held, every store tells where the log was cut."""
    c7 = checkpoint_at(site, tmp_path, 7)
    c10 = checkpoint(site, tmp_path / "c10")
    forged = site.copy("forged")
    forged.rewrite("ws", [e for _, e in forged.events("ws")][:7])
    assert_detected(forged, [c7, c10], 8)


def checkpoint_at(site: Site, tmp_path: Path, size: int) -> Path:
    """A checkpoint of the log's first ``size`` events, taken from a copy cut there (as a
    client would have seen it earlier)."""
    early = site.copy(f"early{size}")
    early.rewrite("ws", [e for _, e in early.events("ws")][:size])
    path = tmp_path / f"c{size}"
    early.ok("checkpoint", "ws", "--out", str(path))
    return path


def test_a_checkpoint_of_another_key_or_workspace_is_refused(site: Site, tmp_path: Path) -> None:
    c10 = checkpoint(site, tmp_path / "c10")
    other = site.new("otherhub")
    other.ok("append", "ws", stdin=EVENTS)
    code, _, err = other("verify", "ws", "--checkpoint", str(c10))
    assert code == 1 and "no checkpoint key" in err  # nothing to check it with
    other.ok("checkpoint", "key")
    code, _, err = other("verify", "ws", "--checkpoint", str(c10))
    assert code == 1 and f"checkpoint {c10}: the note is not signed by" in err
    site.ok("append", "elsewhere", stdin=EVENTS)
    code, _, err = site("verify", "elsewhere", "--checkpoint", str(c10))
    assert code == 1 and "not 'agora." in err and "/elsewhere'" in err
    code, _, err = site("verify", "--checkpoint", str(c10))
    assert code == 2 and "needs a WORKSPACE" in err


def test_witness_key_requires_a_cosignature(site: Site, tmp_path: Path) -> None:
    c10 = checkpoint(site, tmp_path / "c10")
    witness = generate_signer("witness.example/w1", COSIGNATURE_V1)
    code, _, err = site(
        "verify", "ws", "--checkpoint", str(c10), "--witness-key", witness.verifier.vkey()
    )
    assert code == 1 and "not cosigned by 'witness.example/w1'" in err
    note = parse_note(c10.read_text())
    cosigned = tmp_path / "c10-cosigned"
    cosigned.write_text(
        format_note(add_signatures(note, [witness.sign(note.text, timestamp=1_700_000_000)]))
    )
    site.ok("verify", "ws", "--checkpoint", str(cosigned), "--witness-key", witness.verifier.vkey())


def test_prove_and_verify_proof_offline(site: Site, tmp_path: Path) -> None:
    key = site.ok("checkpoint", "key").strip()
    proof = tmp_path / "proof.json"
    proof.write_text(site.ok("prove", "ws", "4"))
    document = json.loads(proof.read_text())
    assert document["seq"] == 4 and document["treeSize"] == 10
    assert document["event"]["payload"]["text"] == "message 4"
    assert len(document["inclusion"]) == 4  # ceil(log2(10))
    # Offline: no data directory or store at all.
    code = main(["verify-proof", str(proof), "--key", key])
    out, err = site.capsys.readouterr()
    assert code == 0, err
    assert out == f"ok seq 4 of ws is in the tree of size 10 signed by {key.split('+')[0]}\n"

    def refused(edit: Callable[[dict[str, object]], None], why: str) -> None:
        bad = json.loads(proof.read_text())
        edit(bad)
        path = tmp_path / "bad.json"
        path.write_text(json.dumps(bad))
        assert main(["verify-proof", str(path), "--key", key]) == 1
        assert why in site.capsys.readouterr().err

    def forge_event(d: dict[str, object]) -> None:
        event = decode_event(json.dumps(d["event"]).encode())
        event = msgspec.structs.replace(event, payload=MessagePayload(text="forged"))
        event = msgspec.structs.replace(event, hash=compute_hash(event))
        d["event"] = json.loads(encode_event(event))

    refused(forge_event, "leaf 3 is not in the tree of size 10")
    refused(lambda d: d.update(seq=5), "the event is seq 4")
    refused(lambda d: d.update(treeSize=11), "the checkpoint signs size 10")
    refused(lambda d: d.update(inclusion=list(d["inclusion"])[:-1]), "too short")  # type: ignore[call-overload]
    refused(
        lambda d: d.update(checkpoint=str(d["checkpoint"]).replace("\n10\n", "\n11\n")),
        "does not verify",
    )
    other = generate_signer("agora.cafe0000").verifier.vkey()
    assert main(["verify-proof", str(proof), "--key", other]) == 1
    site.capsys.readouterr()
    # Against an older checkpoint kept in the store.
    site.ok("append", "ws", stdin=EVENTS)
    old = json.loads(site.ok("prove", "ws", "4", "--size", "10"))
    assert old["treeSize"] == 10
    code, _, err = site("prove", "ws", "4", "--size", "12")
    assert code == 1 and "no checkpoint of 'ws' at size 12 (kept: 10)" in err
    new = json.loads(site.ok("prove", "ws", "15"))
    assert new["treeSize"] == 20  # a checkpoint covering seq 15 was signed on demand


def test_export_and_import_carry_checkpoints(site: Site, tmp_path: Path) -> None:
    c10 = checkpoint(site, tmp_path / "c10")
    key = tmp_path / "key"
    key.write_text(site.ok("checkpoint", "key"))
    export, checkpoints = tmp_path / "ws.jsonl", tmp_path / "ws.checkpoints"
    site.ok("export", "ws", "-o", str(export), "--checkpoints", str(checkpoints))
    lines = checkpoints.read_text().splitlines()
    assert len(lines) == 1 and json.loads(lines[0])["size"] == 10

    target = site.new("target")
    out = target.ok("import", "ws", "-i", str(export), "--checkpoints", str(checkpoints))
    assert "1 checkpoint(s) kept" in out
    # The restored log verifies against the source's checkpoint, with the source's key.
    target.ok("verify", "ws", "--checkpoint", str(c10), "--key", str(key))
    again = tmp_path / "again.checkpoints"
    target.ok("export", "ws", "-o", str(tmp_path / "again.jsonl"), "--checkpoints", str(again))
    assert again.read_text() == checkpoints.read_text()

    # A checkpoint the export does not match is refused before anything is imported.
    forged = json.loads(lines[0])
    forged["note"] = forged["note"].replace("ws\n10\n", "ws\n9\n")
    forged["size"] = 9
    bad = tmp_path / "bad.checkpoints"
    bad.write_text(json.dumps(forged) + "\n")
    fresh = site.new("fresh")
    code, _, err = fresh("import", "ws", "-i", str(export), "--checkpoints", str(bad))
    assert code == 1 and "not the one this checkpoint signed" in err
    code, out, _ = fresh("workspaces", "--json")
    assert code != 0 or json.loads(out or "[]") == []
