"""``agora blobs gc``, ``agora verify``'s blob checks, and ``export --blobs`` of a workspace
without blobs, on a real SQLite data directory through the real command line (in-process)."""

from __future__ import annotations

import asyncio
import base64
import hashlib
import io
import json
import os
from pathlib import Path

import pytest

from hub.cli import main
from hub.log.blobs import FileBlobStore

BIG = os.urandom(100_000)  # above the blob threshold: the hub moves it to the blob store
SHA = hashlib.sha256(BIG).hexdigest()


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out = capsys.readouterr()
    return code, out.out, out.err


def append(monkeypatch: pytest.MonkeyPatch, data: Path, workspace: str, *drafts: object) -> None:
    monkeypatch.setattr("sys.stdin", io.StringIO("".join(json.dumps(d) + "\n" for d in drafts)))
    assert main(["append", workspace, "--data", str(data)]) == 0


@pytest.fixture
def data(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    d = tmp_path / "data"
    write = {
        "kind": "fileWritten",
        "payload": {"path": "a.bin", "base64": base64.b64encode(BIG).decode()},
    }
    append(monkeypatch, d, "demo", write)
    assert (d / "blobs" / SHA[:2] / SHA[2:]).read_bytes() == BIG
    return d


def test_gc_removes_only_unreferenced_blobs_past_the_grace(
    data: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    capsys.readouterr()
    orphan = asyncio.run(FileBlobStore(data / "blobs").put(b"nobody refers to me"))
    code, out, _ = run(capsys, "blobs", "gc", "--data", str(data))
    assert code == 0 and "0 unreferenced" in out  # the orphan is younger than the grace
    code, out, _ = run(capsys, "blobs", "gc", "--grace", "0", "--dry-run", "--data", str(data))
    assert code == 0 and f"would remove {orphan}" in out
    assert (data / "blobs" / orphan[:2] / orphan[2:]).exists()
    code, out, _ = run(capsys, "blobs", "gc", "--grace", "0", "--data", str(data))
    assert code == 0 and f"removed {orphan}" in out and "1 referenced" in out
    assert not (data / "blobs" / orphan[:2] / orphan[2:]).exists()
    assert (data / "blobs" / SHA[:2] / SHA[2:]).exists()


def test_gc_drops_unreferenced_grants_past_the_grace(
    data: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """An upload committed for a workspace and never referenced holds its quota only until
    gc: then the grant goes, and the blob with it. A referenced grant stays."""
    capsys.readouterr()
    store = FileBlobStore(data / "blobs")
    orphan = asyncio.run(store.put(b"uploaded, never referenced"))
    asyncio.run(store.grant("demo", orphan, 26, "alice"))
    asyncio.run(store.grant("demo", SHA, len(BIG), "alice"))  # demo references it
    code, out, _ = run(capsys, "blobs", "gc", "--data", str(data))
    assert code == 0 and "0 unreferenced" in out  # younger than the grace: kept
    assert asyncio.run(store.grants("demo")) == {orphan: 26, SHA: len(BIG)}
    code, out, _ = run(capsys, "blobs", "gc", "--grace", "0", "--data", str(data))
    assert code == 0 and "dropped 1 unreferenced grant" in out and f"removed {orphan}" in out
    assert asyncio.run(store.grants("demo")) == {SHA: len(BIG)}
    assert not asyncio.run(store.has(orphan))


def test_bad_duration_is_a_usage_error(data: Path, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as info:
        main(["blobs", "gc", "--grace", "soon", "--data", str(data)])
    assert info.value.code == 2


def test_verify_checks_referenced_blobs(data: Path, capsys: pytest.CaptureFixture[str]) -> None:
    capsys.readouterr()
    code, out, _ = run(capsys, "verify", "--data", str(data))
    assert code == 0, out
    path = data / "blobs" / SHA[:2] / SHA[2:]
    path.write_bytes(BIG[:-1] + bytes([BIG[-1] ^ 0xFF]))  # the last byte, always changed
    code, out, err = run(capsys, "verify", "--data", str(data))
    assert code == 1 and f"blob {SHA} does not match its hash" in err
    path.unlink()
    code, out, err = run(capsys, "verify", "--data", str(data))
    assert code == 1 and "not in the blob store" in err


def test_export_without_blobs_creates_the_directory_import_reads(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    src, dst = tmp_path / "src", tmp_path / "dst"
    append(monkeypatch, src, "plain", {"kind": "messagePosted", "payload": {"text": "hi"}})
    out, blobs = tmp_path / "plain.jsonl", tmp_path / "blobs-out"
    code, _, err = run(
        capsys, "export", "plain", "--data", str(src), "-o", str(out), "--blobs", str(blobs)
    )
    assert code == 0, err
    assert blobs.is_dir()
    code, _, err = run(
        capsys, "import", "plain", "--data", str(dst), "-i", str(out), "--blobs", str(blobs)
    )
    assert code == 0, err
