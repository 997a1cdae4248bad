"""Black-box tests of the exec ops over real sockets against a real ``agora serve``
(``process`` backend): results, refusals, limits, kill, the journal, getExec, dispose, the id
rules and the concurrency cap. Container-specific tests: test_container.py."""

from __future__ import annotations

import asyncio
import base64
import socket
from collections.abc import Callable
from typing import Any

from tests.support.hub import HubProcess
from tests.support.peer import ExecPeer, exec_peer, of_exec, of_kind
from tests.support.tokens import SECRET, mint_exec

MIB = 1024 * 1024


async def wait_for_output(p: ExecPeer, exec_id: str, workspace: str = "w") -> None:
    """Until the execution has journaled some output."""
    async with asyncio.timeout(20):
        while True:
            if of_kind(of_exec(await p.log(workspace), exec_id), "execOutput"):
                return
            await asyncio.sleep(0.05)


async def test_stdout_stderr_and_exit_code(runtime_hub: HubProcess) -> None:
    async with exec_peer(runtime_hub.url) as p:
        failed = await p.run(source="echo out; echo err >&2; exit 3")
        ok = await p.run(source="printf 'caf\\303\\251'")
    assert (failed["status"], failed["reason"], failed["exitCode"]) == ("failed", "exit", 3)
    assert (failed["stdout"], failed["stderr"]) == ("out\n", "err\n")
    assert failed["encoding"] == "utf8" and not failed["stdoutTruncated"]
    assert (ok["status"], ok["exitCode"], ok["stdout"]) == ("completed", 0, "café")
    assert "value" not in ok  # command backends return no value


async def test_base64_encoding_and_invalid_utf8(runtime_hub: HubProcess) -> None:
    async with exec_peer(runtime_hub.url) as p:
        raw = await p.run(source="printf 'a\\377b'", encoding="base64")
        text = await p.run(source="printf 'a\\377b'", encoding="utf8")
    assert base64.b64decode(raw["stdout"]) == b"a\xffb" and raw["encoding"] == "base64"
    assert text["stdout"] == "a\ufffdb"


async def test_omitted_backend_is_the_first_and_ids_are_minted(runtime_hub: HubProcess) -> None:
    async with exec_peer(runtime_hub.url) as p:
        result = await p.run(source="true")
        events = of_exec(await p.log(), result["execId"])
    assert len(result["execId"]) == 36  # a UUID
    requested = of_kind(events, "execRequested")[0]
    assert requested["payload"]["backend"] == "process"
    assert requested["producer"] == "alice"
    assert [e["kind"] for e in events] == ["execRequested", "execStarted", "execFinished"]


async def test_the_request_is_logged_without_secrets(runtime_hub: HubProcess) -> None:
    config = runtime_hub.config
    assert config is not None
    async with exec_peer(runtime_hub.url) as p:
        # The "process" instance allows no variables: the request is refused, nothing logged.
        refused = await p.exec(source="env", env={"TOKEN": "s3cret"})
        assert (refused["op"], refused["code"]) == ("error", "forbidden"), refused
        assert await p.log() == []


async def test_env_values_are_not_logged(start_runtime_hub: Callable[..., HubProcess]) -> None:
    hub = start_runtime_hub(
        '[[backends]]\nid = "p"\nkind = "process"\naccess = "read-write"\n'
        'limits = { env_allow = "TOKEN" }\n'
    )
    async with exec_peer(hub.url) as p:
        result = await p.run(backend="p", source='echo "[$TOKEN]"', env={"TOKEN": "s3cret"})
        log = await p.log()
    assert result["stdout"] == "[s3cret]\n"
    requested = of_kind(log, "execRequested")[0]["payload"]
    assert requested["envKeys"] == ["TOKEN"]
    assert "s3cret" not in str(log)


async def test_input_is_refused_on_a_non_callable_backend(runtime_hub: HubProcess) -> None:
    async with exec_peer(runtime_hub.url) as p:
        container = await p.exec(backend="container", source="cat", input={"a": 1})
        command = await p.exec(backend="process", source="cat", input={"a": 1})
        python = await p.run(backend="python", source="input['a'] + 1", input={"a": 1})
        log = await p.log()
    for refused in (container, command):
        assert (refused["op"], refused["code"]) == ("error", "badRequest"), refused
        assert "not callable" in refused["message"]
        assert refused["details"]["field"] == "$.input"
    assert python["value"] == 2
    assert len(of_kind(log, "execRequested")) == 1  # only the python one was accepted


async def test_timeout_stops_an_infinite_loop(runtime_hub: HubProcess) -> None:
    async with exec_peer(runtime_hub.url) as p:
        result = await p.run(source="echo spinning; while :; do :; done", timeoutMs=500)
    assert (result["status"], result["reason"], result["exitCode"]) == ("failed", "timeout", 124)
    assert result["stdout"] == "spinning\n"
    assert 400 <= result["durationMs"] < 10_000
    assert any(d.get("code") == "timeout" for d in result["diagnostics"])


async def test_kill_mid_run_is_cancelled_130_with_the_partial_output(
    runtime_hub: HubProcess,
) -> None:
    async with exec_peer(runtime_hub.url) as p, exec_peer(runtime_hub.url, mint_exec("bob")) as bob:
        accepted = await p.exec(source="echo started; sleep 30; echo never", execId="k1")
        assert accepted["op"] == "execAccepted", accepted
        await wait_for_output(p, "k1")
        # Two kills at once share one finalisation.
        first, second = await asyncio.gather(
            bob.call("kill", workspace="w", execId="k1"), p.call("kill", workspace="w", execId="k1")
        )
        result = (await p.call("execResult", workspace="w", execId="k1"))["result"]
        again = await p.call("kill", workspace="w", execId="k1")  # finished: a no-op
        events = of_exec(await p.log(), "k1")
    assert first["op"] == second["op"] == "killed", (first, second)
    assert first["status"] == second["status"] == "cancelled"
    assert (again["op"], again["status"]) == ("killed", "cancelled")
    assert (result["status"], result["reason"], result["exitCode"]) == ("cancelled", "killed", 130)
    assert result["stdout"] == "started\n"
    assert result["stderr"].endswith("Execution cancelled.\n")
    cancels = of_kind(events, "execCancelRequested")
    assert len(cancels) == 1 and cancels[0]["producer"] in ("alice", "bob")
    assert cancels[0]["seq"] < of_kind(events, "execFinished")[0]["seq"]


async def test_ten_megabytes_of_output_are_truncated_and_coalesced(
    runtime_hub: HubProcess,
) -> None:
    async with exec_peer(runtime_hub.url) as p:
        result = await p.run(source="head -c 10000000 /dev/zero | tr '\\0' a", within=60)
        outputs = of_kind(of_exec(await p.log(), result["execId"]), "execOutput")
    assert result["status"] == "completed"
    assert result["stdoutTruncated"] and not result["stderrTruncated"]
    assert result["stdout"] == "a" * MIB  # the default cap: 1 MiB kept
    sizes = [len(base64.b64decode(e["payload"]["data"])) for e in outputs]
    assert sum(sizes) == MIB and max(sizes) <= 64 * 1024
    assert len(outputs) <= 64  # coalesced, not one event per write
    assert [e["payload"]["n"] for e in outputs] == list(range(1, len(outputs) + 1))


async def test_chatty_output_is_coalesced(runtime_hub: HubProcess) -> None:
    async with exec_peer(runtime_hub.url) as p:
        result = await p.run(source="i=0; while [ $i -lt 2000 ]; do echo $i; i=$((i+1)); done")
        outputs = of_kind(of_exec(await p.log(), result["execId"]), "execOutput")
    assert result["stdout"] == "".join(f"{i}\n" for i in range(2000))
    assert len(outputs) < 100  # 2000 writes, flushed every 50 ms or 64 KiB


async def test_network_disabled_means_no_connection_not_even_to_the_hub(
    runtime_hub: HubProcess,
) -> None:
    program = (
        "import socket, sys\n"
        "try:\n"
        f"    socket.create_connection(('127.0.0.1', {runtime_hub.port}), timeout=2)\n"
        "except OSError as e:\n"
        "    print('refused', e); sys.exit(7)\n"
        "print('connected')\n"
    )
    async with exec_peer(runtime_hub.url) as p:
        result = await p.run(source=program, language="python")
        # The instance's default is network off; a request may not widen it.
        wider = await p.exec(source="true", policy={"network": "enabled"})
    assert (result["status"], result["exitCode"]) == ("failed", 7), result
    assert result["stdout"].startswith("refused")
    assert (wider["op"], wider["code"]) == ("error", "forbidden"), wider
    assert wider["details"]["execCode"] == "rejected"


async def test_the_hub_environment_is_invisible(runtime_hub: HubProcess) -> None:
    async with exec_peer(runtime_hub.url) as p:
        result = await p.run(source="env")
    assert result["status"] == "completed"
    assert "AGORA_SECRET" not in result["stdout"] and SECRET not in result["stdout"]
    assert "PATH=" in result["stdout"]


async def test_files_are_pushed_and_changes_pulled_as_caused_events(
    runtime_hub: HubProcess,
) -> None:
    async with exec_peer(runtime_hub.url) as p:
        for path, text in (("seed.txt", "seeded\n"), ("gone.txt", "x"), ("dir/keep.txt", "k")):
            ack = await p.publish(
                "w", {"kind": "fileWritten", "payload": {"path": path, "text": text}}
            )
            assert ack["op"] == "ack", ack
        result = await p.run(
            source="cat seed.txt; echo made > made.txt; mkdir -p sub; printf '\\377' > sub/b.bin;"
            " rm gone.txt; echo more >> seed.txt",
            execId="files",
        )
        log = await p.log()
        state = (await p.call("state", workspace="w", contents=True))["state"]
    assert result["status"] == "completed" and result["stdout"] == "seeded\n"
    assert (result["pushed"], result["pulled"], result["skipped"]) == (3, 4, [])
    requested = of_kind(of_exec(log, "files"), "execRequested")[0]
    finished = of_kind(of_exec(log, "files"), "execFinished")[0]
    changes = [e for e in log if e["kind"] in ("fileWritten", "fileDeleted")][3:]
    assert {(e["kind"], e["payload"]["path"]) for e in changes} == {
        ("fileWritten", "made.txt"),
        ("fileWritten", "sub/b.bin"),
        ("fileWritten", "seed.txt"),
        ("fileDeleted", "gone.txt"),
    }
    for event in changes:
        assert event["causationId"] == requested["id"]
        assert event["producer"] == "alice"
        assert requested["seq"] < event["seq"] < finished["seq"]
    assert state["files"]["made.txt"]["text"] == "made\n"
    assert state["files"]["seed.txt"]["text"] == "seeded\nmore\n"
    assert base64.b64decode(state["files"]["sub/b.bin"]["base64"]) == b"\xff"
    assert "gone.txt" not in state["files"]


async def test_a_read_only_instance_cannot_write(runtime_hub: HubProcess) -> None:
    # The confined process backend binds a read instance's workspace read-only: the writes
    # fail in the program itself, so nothing is there to skip or pull back.
    async with exec_peer(runtime_hub.url) as p:
        await p.publish("w", {"kind": "fileWritten", "payload": {"path": "seed.txt", "text": "s"}})
        result = await p.run(backend="ro", source="echo x > new.txt; rm seed.txt; ls")
        log = await p.log()
    assert result["status"] == "completed"
    assert (result["pushed"], result["pulled"], result["skipped"]) == (1, 0, [])
    assert result["stdout"] == "seed.txt\n"
    assert result["stderr"].count("Read-only file system") == 2
    assert [e["kind"] for e in log if e["kind"].startswith("file")] == ["fileWritten"]


async def test_a_token_without_the_backend_is_forbidden(runtime_hub: HubProcess) -> None:
    only_ro = mint_exec("carol", backends=("ro",))
    no_exec = mint_exec("dave", rights=("read", "write"))
    async with (
        exec_peer(runtime_hub.url, only_ro) as carol,
        exec_peer(runtime_hub.url, no_exec) as dave,
    ):
        named = await carol.exec(backend="process", source="true")
        default = await carol.exec(source="true")  # the default backend is "process"
        allowed = await carol.run(backend="ro", source="true")
        no_right = await dave.exec(backend="process", source="true")
        log = await carol.log()
    for refused in (named, default):
        assert (refused["op"], refused["code"]) == ("error", "forbidden"), refused
        assert refused["details"]["backend"] == "process"
    assert (no_right["op"], no_right["code"], no_right["details"]["right"]) == (
        "error",
        "forbidden",
        "exec",
    )
    assert allowed["status"] == "completed"
    assert len(of_kind(log, "execRequested")) == 1


async def test_get_exec_full_tail_and_n(runtime_hub: HubProcess) -> None:
    async with exec_peer(runtime_hub.url) as p:
        await p.run(source="echo a; sleep 0.2; echo b; sleep 0.2; echo c", execId="done")
        full, end = await p.stream("w", "done", "full")
        after1, _ = await p.stream("w", "done", 1)
        tail, tail_end = await p.stream("w", "done", "tail")
        # Live: a running execution is replayed, then followed to its end.
        accepted = await p.exec(source="echo x; sleep 0.5; echo y", execId="live", encoding="utf8")
        assert accepted["op"] == "execAccepted"
        live, live_end = await p.stream("w", "live", "full")
    kinds = [f["event"]["kind"] for f in full]
    assert kinds == ["execRequested", "execStarted", *["execOutput"] * 3, "execFinished"]
    assert [f["text"] for f in full if f["event"]["kind"] == "execOutput"] == ["a\n", "b\n", "c\n"]
    assert (end["op"], end["status"]) == ("execEnd", "completed")
    assert [(f["event"]["kind"], f["event"]["payload"].get("n")) for f in after1] == [
        ("execOutput", 2),
        ("execOutput", 3),
        ("execFinished", None),
    ]
    assert tail == [] and tail_end["status"] == "completed"
    assert [f["event"]["kind"] for f in live][-1] == "execFinished"
    assert "".join(f.get("text") or "" for f in live) == "x\ny\n"
    assert live_end["status"] == "completed"
    seqs = [f["event"]["seq"] for f in live]
    assert seqs == sorted(set(seqs))  # no gap or duplicate across the replay/live switch


async def test_get_exec_tail_of_a_running_execution(runtime_hub: HubProcess) -> None:
    async with exec_peer(runtime_hub.url) as p:
        await p.exec(source="echo early; sleep 0.6; echo late", execId="t")
        await wait_for_output(p, "t")
        tail, end = await p.stream("w", "t", "tail")
    assert [f["text"] for f in tail if f["event"]["kind"] == "execOutput"] == ["late\n"]
    assert [f["event"]["kind"] for f in tail] == ["execOutput", "execFinished"]
    assert end["status"] == "completed"


async def test_dispose_frees_the_id(runtime_hub: HubProcess) -> None:
    async with exec_peer(runtime_hub.url) as p:
        await p.exec(source="sleep 30", execId="d")
        running = await p.call("dispose", workspace="w", execId="d")
        await p.call("kill", workspace="w", execId="d")
        retained = await p.exec(source="true", execId="d")
        disposed = await p.call("dispose", workspace="w", execId="d")
        twice = await p.call("dispose", workspace="w", execId="d")
        gone = await p.call("execResult", workspace="w", execId="d")
        reused = await p.run(source="echo again", execId="d")
        log = await p.log()
    assert (running["op"], running["code"]) == ("error", "busy")
    assert (retained["op"], retained["code"]) == ("error", "exists")
    assert disposed["op"] == "disposed"
    assert (twice["code"], gone["code"]) == ("notFound", "notFound")
    assert reused["stdout"] == "again\n"
    assert [e["kind"] for e in of_exec(log, "d")].count("execDisposed") == 1


async def test_busy_exists_and_not_found(runtime_hub: HubProcess) -> None:
    async with exec_peer(runtime_hub.url) as p:
        await p.exec(source="sleep 30", execId="b")
        busy = await p.exec(source="true", execId="b")
        unknown_backend = await p.exec(backend="nope", source="true")
        no_result = await p.call("execResult", workspace="w", execId="nope")
        no_kill = await p.call("kill", workspace="w", execId="nope")
        no_stream = await p.stream("w", "nope")
        empty_id = await p.exec(source="true", execId="")
        long_id = await p.exec(source="true", execId="é" * 129)
        ok_id = await p.run(source="true", execId="é" * 128)  # 256 UTF-8 bytes
        await p.call("kill", workspace="w", execId="b")
        exists = await p.exec(source="true", execId="b")
    assert (busy["code"], exists["code"]) == ("busy", "exists")
    assert unknown_backend["code"] == "notFound" and unknown_backend["details"]["backend"] == "nope"
    assert no_result["code"] == no_kill["code"] == no_stream[1]["code"] == "notFound"
    assert empty_id["code"] == long_id["code"] == "badRequest"
    assert ok_id["status"] == "completed"


async def test_the_concurrency_cap(start_runtime_hub: Callable[..., HubProcess]) -> None:
    hub = start_runtime_hub(args=("--max-executions", "2"))
    async with exec_peer(hub.url) as p:
        for i in range(2):
            assert (await p.exec(source="sleep 30", execId=f"c{i}"))["op"] == "execAccepted"
        full = await p.exec(source="true", execId="c2")
        await p.call("kill", workspace="w", execId="c0")
        after = await p.run(source="echo room", execId="c3")
        await p.call("kill", workspace="w", execId="c1")
    assert (full["code"], full["details"]["limit"]) == ("busy", 2)
    assert after["stdout"] == "room\n"


async def test_live_readers_are_capped(runtime_hub: HubProcess) -> None:
    async with exec_peer(runtime_hub.url) as p:
        await p.exec(source="sleep 30", execId="r")
        rids: list[Any] = []
        for i in range(8):
            rids.append(f"s{i}")
            await p.send({"op": "getExec", "rid": f"s{i}", "workspace": "w", "execId": "r"})
        refused = await p.stream("w", "r")
        await p.call("kill", workspace="w", execId="r")
        ends = []
        for rid in rids:
            while (frame := await p.reply(rid))["op"] == "execEvent":
                pass
            ends.append(frame)
    assert (refused[1]["op"], refused[1]["code"]) == ("error", "busy")
    assert {(e["op"], e["status"]) for e in ends} == {("execEnd", "cancelled")}


async def test_python_backend_writes_through_the_log(runtime_hub: HubProcess) -> None:
    async with exec_peer(runtime_hub.url) as p:
        await p.publish("w", {"kind": "fileWritten", "payload": {"path": "in.txt", "text": "21"}})
        result = await p.run(
            backend="python",
            source="n = int(read_file('in.txt'))\nwrite_file('out.txt', str(n * 2))\nn * 2",
            execId="py",
        )
        log = await p.log()
    assert (result["status"], result["value"], result["pulled"]) == ("completed", 42, 1)
    requested = of_kind(of_exec(log, "py"), "execRequested")[0]
    written = [e for e in log if e["kind"] == "fileWritten" and e["payload"]["path"] == "out.txt"]
    assert written[0]["causationId"] == requested["id"] and written[0]["payload"]["text"] == "42"


def test_hub_port_really_listens(runtime_hub: HubProcess) -> None:
    # Guards the network test above: the port it fails to reach is open from the host.
    with socket.create_connection(("127.0.0.1", runtime_hub.port), timeout=2):
        pass


async def test_a_failed_push_aborts_the_run(runtime_hub: HubProcess) -> None:
    big = "x" * (100 * 1024)  # above the blob threshold: the content lives in the blob store
    async with exec_peer(runtime_hub.url) as p:
        await p.publish("w", {"kind": "fileWritten", "payload": {"path": "big.txt", "text": big}})
        sha = (await p.call("state", workspace="w"))["state"]["files"]["big.txt"]["blob"]
        _remove_blob(runtime_hub, sha)
        result = await p.run(source="echo ran > ran.txt", execId="nopush")
        events = of_exec(await p.log(), "nopush")
    assert (result["status"], result["reason"], result["pushed"]) == ("failed", "error", 0)
    assert result["diagnostics"][0]["code"] == "pushFailed"
    assert [e["kind"] for e in events] == ["execRequested", "execFinished"]  # it never ran


def _remove_blob(hub: HubProcess, sha: str) -> None:
    (path,) = list(hub.data_dir.rglob(sha[2:]))
    path.unlink()


async def test_a_wasm_module_inline_then_by_blob(
    start_runtime_hub: Callable[..., HubProcess],
) -> None:
    from tests.backends import wat

    hub = start_runtime_hub('[[backends]]\nid = "wasm"\nkind = "wasm"\naccess = "read-write"\n')
    module = wat.wasm(wat.HELLO)
    async with exec_peer(hub.url) as p:
        inline = await p.run(module=base64.b64encode(module).decode(), execId="m1")
        logged = of_kind(of_exec(await p.log(), "m1"), "execRequested")[0]["payload"]
        by_blob = await p.run(module={"blob": logged["module"]["blob"]}, execId="m2")
        both = await p.exec(module={"blob": logged["module"]["blob"]}, source="x")
        # Another workspace knows the hash only: it runs nothing (a hash opens nothing).
        elsewhere = await p.exec("elsewhere", module={"blob": logged["module"]["blob"]})
        assert (elsewhere["op"], elsewhere["code"]) == ("error", "notFound"), elsewhere
    assert inline["status"] == by_blob["status"] == "completed", (inline, by_blob)
    assert inline["stdout"] == by_blob["stdout"] != ""
    assert logged["language"] == "wasm" and set(logged["module"]) == {"blob"}
    assert (both["op"], both["code"]) == ("error", "badRequest")


DEEP_PYTHON = "x = 1\nfor i in range(980):\n    x = [x]\nx"
DEEP_HARNESS = "import sys\nsys.stdout.write('[' * 900 + ']' * 900 + '\\n')"


async def test_a_value_too_deep_for_the_log_ends_the_run_output_limit(
    runtime_hub: HubProcess,
) -> None:
    """Issue #11 item 1 (exec): a value nested ~980 deep from the python backend, and a
    harness value line nested 900 deep from a command backend (process, ``language: python``)
    never reach ``execFinished`` as they are: each run is ``failed/outputLimit`` with a
    diagnostic naming ``max_depth``; ``execResult`` answers, and the hub restarts and answers
    again."""
    async with exec_peer(runtime_hub.url) as p:
        python = await p.run(source=DEEP_PYTHON, backend="python")
        harness = await p.run(source=DEEP_HARNESS, backend="process", language="python")
    for result in (python, harness):
        assert (result["status"], result["reason"]) == ("failed", "outputLimit"), result
        assert "value" not in result
        (note,) = result["diagnostics"]
        assert note["code"] == "outputLimit" and "max_depth" in note["message"]
    assert runtime_hub.terminate() == 0
    runtime_hub.restart()
    async with exec_peer(runtime_hub.url) as p:
        for before in (python, harness):
            reply = await p.call("execResult", workspace="w", execId=before["execId"])
            assert reply["op"] == "execResult", reply
            assert reply["result"]["reason"] == "outputLimit"
        assert (await p.run(source="true"))["status"] == "completed"  # it serves as before
