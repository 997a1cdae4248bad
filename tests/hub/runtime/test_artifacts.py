"""Execution artifacts over real sockets against a real ``agora serve``: a request names
output globs, the run's matching files become blobs and ``artifactPublished`` events caused by
the request, ``execResult`` lists them, ``agora replay`` shows them, and a second agent
fetches them with ``getBlob``. Process, container (Docker), wasm and rust backends."""

from __future__ import annotations

import asyncio
import base64
import hashlib
import json
import shutil
import sys
from collections.abc import Callable

from hub.client import connect
from tests.support.docker import need_docker
from tests.support.hub import HubProcess
from tests.support.paths import REPO
from tests.support.peer import ExecPeer, Frame, exec_peer, of_exec, of_kind
from tests.support.require import require
from tests.support.tokens import mint_exec

SCRIPT = (
    "mkdir -p out && printf 'png-ish' > out/a.png && head -c 300000 /dev/zero > out/b.png "
    "&& echo no > out/c.txt && ln -s /etc/passwd out/leak.png"
)


async def _check(hub: HubProcess, p: ExecPeer, result: Frame, keys: list[str]) -> list[Frame]:
    assert result["status"] == "completed", result
    assert sorted(a["key"] for a in result["artifacts"]) == keys
    events = of_exec(await p.log(), result["execId"])
    requested = of_kind(events, "execRequested")[0]
    published = of_kind(await p.log(), "artifactPublished")
    mine = [e for e in published if e["payload"].get("execId") == result["execId"]]
    assert sorted(e["payload"]["key"] for e in mine) == keys
    for e in mine:
        assert e["causationId"] == requested["id"]
        assert e["payload"]["sha256"] == e["payload"]["blob"]
    # A second agent reads each artifact back, byte-identical to what the run wrote.
    async with connect(hub.url, hub.token("bob")) as bob:
        ws = bob.workspace("w")
        for ref in result["artifacts"]:
            data = await ws.get_blob(ref["sha256"])
            assert isinstance(data, bytes) and len(data) == ref["sizeBytes"]
            assert hashlib.sha256(data).hexdigest() == ref["sha256"]
    return mine


async def test_process_artifacts_by_glob_never_follow_links(runtime_hub: HubProcess) -> None:
    async with exec_peer(runtime_hub.url) as p:
        result = await p.run(source=SCRIPT, artifacts=["out/*.png"])
        mine = await _check(runtime_hub, p, result, ["out/a.png", "out/b.png"])
    media = {e["payload"]["key"]: e["payload"]["mediaType"] for e in mine}
    assert media["out/a.png"] == "image/png"
    sizes = {a["key"]: a["sizeBytes"] for a in result["artifacts"]}
    assert sizes == {"out/a.png": 7, "out/b.png": 300000}
    # `agora replay` shows them (the hub's SQLite log, read by the command line).
    runtime_hub.terminate()
    replay = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "hub",
        "replay",
        "w",
        "--data",
        str(runtime_hub.data_dir),
        cwd=REPO,
        stdout=asyncio.subprocess.PIPE,
    )
    out, _ = await asyncio.wait_for(replay.communicate(), 60)
    assert replay.returncode == 0
    assert out.decode().count("artifactPublished") == 2, out


async def test_escaping_globs_are_refused(runtime_hub: HubProcess) -> None:
    async with exec_peer(runtime_hub.url) as p:
        for glob in ["../*", "/etc/passwd", ""]:
            reply = await p.exec(source="true", artifacts=[glob])
            assert (reply["op"], reply["code"]) == ("error", "badRequest"), reply
            assert reply["details"]["field"].startswith("$.artifacts"), reply
        assert await p.log() == []  # nothing was requested


async def test_container_artifacts(runtime_hub: HubProcess) -> None:
    need_docker()
    async with exec_peer(runtime_hub.url) as p:
        result = await p.run(backend="container", source=SCRIPT, artifacts=["out/*.png"])
        await _check(runtime_hub, p, result, ["out/a.png", "out/b.png"])


async def test_wasm_artifacts(start_runtime_hub: Callable[..., HubProcess]) -> None:
    from tests.backends import wat

    hub = start_runtime_hub('[[backends]]\nid = "wasm"\nkind = "wasm"\naccess = "read-write"\n')
    async with exec_peer(hub.url) as p:
        draft = {"kind": "fileWritten", "payload": {"path": "data.txt", "text": "in\n"}}
        assert (await p.publish("w", draft))["op"] == "ack"
        module = base64.b64encode(wat.wasm(wat.READ_THEN_WRITE)).decode()
        result = await p.run(module=module, artifacts=["out.txt"])
        (event,) = await _check(hub, p, result, ["out.txt"])
    assert event["payload"]["sizeBytes"] == len(b"written\n")
    assert json.dumps(result["artifacts"][0]["sha256"]) != '""'


async def test_client_exec_with_artifacts_fetched_by_a_second_agent(
    runtime_hub: HubProcess,
) -> None:
    async with connect(runtime_hub.url, mint_exec()) as alice:
        ws = alice.workspace("w")
        handle = await ws.runtime.exec("mkdir -p out && echo hi > out/r.txt", artifacts=["out/*"])
        outcome = await handle.result()
    (ref,) = outcome.artifacts
    assert (ref.key, ref.size_bytes, ref.content_type) == ("out/r.txt", 3, "text/plain")
    async with connect(runtime_hub.url, runtime_hub.token("bob")) as bob:
        assert ref.sha256 is not None
        assert await bob.workspace("w").get_blob(ref.sha256) == b"hi\n"


RUST_WRITES = """fn run(_input: serde_json::Value) -> serde_json::Value {
    std::fs::create_dir_all("out").unwrap();
    std::fs::write("out/r.json", b"{\\"ok\\":true}").unwrap();
    serde_json::json!("written")
}"""


async def test_rust_artifacts(start_runtime_hub: Callable[..., HubProcess]) -> None:
    from backends.rust import DEBIAN_REGISTRY

    toolchain = shutil.which("rustc") and shutil.which("cargo")
    serde = list(DEBIAN_REGISTRY.glob("serde_json-*"))
    require("rust", bool(toolchain and serde), "rustc, cargo or Debian's serde_json missing")
    hub = start_runtime_hub('[[backends]]\nid = "rust"\nkind = "rust"\naccess = "read-write"\n')
    async with exec_peer(hub.url) as p:
        result = await p.run(source=RUST_WRITES, language="rust", artifacts=["out/*.json"])
        await _check(hub, p, result, ["out/r.json"])
