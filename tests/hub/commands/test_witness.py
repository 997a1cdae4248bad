"""``agora witness`` as a user runs it (a subprocess) against real ``agora serve`` hubs: it
cosigns consistent checkpoints and hands them back (``agora verify --witness-key`` then
passes on the witnessed log), and reports a split view — two hubs started on copies of one
data directory (same key), one rewritten — with exit 3 and both signed checkpoints.

The witness is a client of the wire only, so one store (SQLite) is enough here; the client's
detection on both stores is tests/hub/client/test_verify.py.
"""

from __future__ import annotations

import asyncio
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from hub.checkpoints import load_key
from hub.core.checkpoint import open_checkpoint, parse_note, parse_signer_key
from tests.support.hub import HubProcess, HubStarter
from tests.support.peer import message, peer
from tests.support.tamper import Backdoor, forged
from tests.support.waiting import wait_for

RUN_TIMEOUT = 120.0  # seconds for one `agora` command on a loaded machine


def agora(*argv: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "hub", *argv], capture_output=True, text=True, timeout=RUN_TIMEOUT
    )


@pytest.fixture
def starter(tmp_path: Path) -> Iterator[HubStarter]:
    starter = HubStarter(tmp_path)
    yield starter
    starter.close()


async def publish(hub: HubProcess, workspace: str, count: int) -> None:
    async with peer(hub.url, hub.token()) as p:
        for i in range(count):
            ack = await p.publish(workspace, message(f"m{i}"))
            assert ack["op"] == "ack", ack


def witness(hub: HubProcess, tmp_path: Path, *extra: str) -> subprocess.CompletedProcess[str]:
    return agora(
        "witness",
        "--hub",
        hub.url,
        "--token",
        hub.token("witness"),
        "--workspace",
        "ws",
        "--dir",
        str(tmp_path / "witness"),
        "--key",
        str(tmp_path / "witness.key"),
        "--once",
        *extra,
    )


def hub_vkey(hub: HubProcess) -> str:
    return load_key(hub.data_dir).verifier.vkey()


async def test_a_consistent_log_is_cosigned_and_verifies_with_the_witness_key(
    starter: HubStarter, tmp_path: Path
) -> None:
    hub = starter.start()
    await publish(hub, "ws", 6)
    first_run = witness(hub, tmp_path)  # no hub key pinned yet, none given
    assert first_run.returncode == 2 and "--hub-key" in first_run.stderr
    done = witness(hub, tmp_path, "--hub-key", hub_vkey(hub))
    assert done.returncode == 0, done.stderr
    assert "cosigned ws at size 6" in done.stdout
    key = tmp_path / "witness.key"
    assert key.stat().st_mode & 0o777 == 0o600
    wvkey = agora("witness", "--key", str(key), "--print-key").stdout.strip()
    assert wvkey == parse_signer_key(key.read_text()).verifier.vkey()
    # The hub serves the cosignature with the checkpoint: an auditor's copy carries it.
    async with peer(hub.url, hub.token()) as p:
        reply = await p.call("checkpoint", workspace="ws")
    assert reply["cosignatures"].startswith("— agora-witness ")
    # The log grows; the next round checks consistency with what DIR kept and cosigns again.
    await publish(hub, "ws", 3)
    again = witness(hub, tmp_path)  # the hub key is pinned in DIR now
    assert again.returncode == 0, again.stderr
    assert "cosigned ws at size 9" in again.stdout
    idle = witness(hub, tmp_path)
    assert idle.returncode == 0 and "cosigned" not in idle.stdout  # already cosigned
    assert hub.terminate() == 0
    store = ["--data", str(hub.data_dir)]
    taken = agora("checkpoint", "ws", "--out", str(tmp_path / "c9"), *store)
    assert taken.returncode == 0, taken.stderr
    checked = agora(
        "verify", "ws", "--checkpoint", str(tmp_path / "c9"), "--witness-key", wvkey, *store
    )
    assert checked.returncode == 0, checked.stderr
    assert "ok checkpoint" in checked.stdout


async def test_a_split_view_is_reported_with_both_checkpoints(
    starter: HubStarter, tmp_path: Path
) -> None:
    honest = starter.start()
    await publish(honest, "ws", 8)
    vkey = hub_vkey(honest)
    assert witness(honest, tmp_path, "--hub-key", vkey).returncode == 0
    # A copy of the data (same key), rewritten with the chain re-hashed, served by a 2nd hub.
    assert honest.terminate() == 0
    fork = Backdoor(honest.data_dir).copy(tmp_path / "fork")
    events = [e for _, e in fork.events("ws")]
    fork.rewrite("ws", [forged(e, "forged") if e.seq == 3 else e for e in events])
    honest.restart()
    forked = starter.start(data_dir=fork.data)
    split = witness(forked, tmp_path)
    assert split.returncode == 3, (split.stdout, split.stderr)
    assert "SPLIT VIEW" in split.stderr
    evidence = sorted((tmp_path / "witness").glob("split-ws-*.txt"))
    assert len(evidence) == 1
    text = evidence[0].read_text()
    seen, shown = text.split("-- checkpoint seen before --\n")[1].split(
        "-- checkpoint shown now --\n"
    )
    key = load_key(honest.data_dir).verifier
    old, _ = open_checkpoint(seen, key)
    new, _ = open_checkpoint(shown, key)
    assert (old.size, new.size) == (8, 8) and old.root != new.root
    # The forged checkpoint was not cosigned; the honest hub still gets cosigned.
    async with peer(forked.url, forked.token()) as p:
        reply = await p.call("checkpoint", workspace="ws")
    assert "cosignatures" not in reply and parse_note(reply["note"]).text.startswith(old.origin)
    await publish(honest, "ws", 1)
    assert witness(honest, tmp_path).returncode == 0


async def test_without_once_it_follows_until_sigterm(starter: HubStarter, tmp_path: Path) -> None:
    hub = starter.start()
    await publish(hub, "ws", 2)
    argv = ["-m", "hub", "witness", "--hub", hub.url, "--token", hub.token()]
    argv += ["--workspace", "ws", "--dir", str(tmp_path / "w"), "--key", str(tmp_path / "k")]
    argv += ["--hub-key", hub_vkey(hub), "--interval", "0.1"]
    out = tmp_path / "witness.out"
    with out.open("w") as sink:
        proc = await asyncio.create_subprocess_exec(
            sys.executable, *argv, stdout=sink, stderr=subprocess.STDOUT
        )
        try:
            await wait_for(lambda: "cosigned ws at size 2" in out.read_text())
            await publish(hub, "ws", 3)
            await wait_for(lambda: "cosigned ws at size 5" in out.read_text())
        finally:
            proc.send_signal(signal.SIGTERM)
            async with asyncio.timeout(RUN_TIMEOUT):
                code = await proc.wait()
    assert code == 0, out.read_text()
