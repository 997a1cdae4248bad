"""The ``javascript`` backend: ES modules (JS and TS) on Deno, host modules, limits, refusals.

Against the real deno binary (the PyPI package) under the real bubblewrap confinement; the
host functions against a recording :class:`WorkspaceAccess`, and through a real ``agora serve``
(writes become ``fileWritten`` events caused by the execution, seen by another agent).
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest

from backends.access import WorkspaceAccess
from backends.base import (
    ExecutionLanguage,
    ExecutionRequest,
    ExecutionResult,
    InvalidRequest,
    OutputChunk,
    Source,
    UnsupportedLanguage,
    collect,
)
from backends.javascript import JavaScriptBackend
from backends.javascript.backend import deno_argv
from backends.javascript.bootstrap import SOCKET
from hub.core.events import SkippedWrite
from hub.core.validation import DEFAULT_LIMITS
from tests.backends.helpers import (
    BOUND_S,
    assert_closed_is_unavailable,
    assert_running_id_is_busy,
    drain,
    new_request,
    until_running,
)
from tests.backends.rigs import Listener, processes_with
from tests.backends.test_monty import RecordingAccess
from tests.support.hub import HubProcess, HubStarter
from tests.support.peer import exec_peer, of_exec, of_kind
from tests.support.require import require
from tests.support.tokens import mint_exec

MIB = 1024 * 1024
JS = ExecutionLanguage.JAVASCRIPT
TS = ExecutionLanguage.TYPESCRIPT


async def _started(backend: JavaScriptBackend) -> JavaScriptBackend:
    await backend.start()
    ok, why = backend.available()
    if not ok:
        await backend.aclose()
    require("deno", ok, why)
    return backend


@pytest.fixture
async def backend() -> AsyncIterator[JavaScriptBackend]:
    made = await _started(JavaScriptBackend())
    try:
        yield made
    finally:
        await made.aclose()


@pytest.fixture
async def read_only() -> AsyncIterator[JavaScriptBackend]:
    made = await _started(JavaScriptBackend("js-ro", access="read"))
    try:
        yield made
    finally:
        await made.aclose()


def request(
    backend: JavaScriptBackend, source: str, language: ExecutionLanguage = JS, **kw: Any
) -> ExecutionRequest:
    return new_request(backend, language=language, payload=Source(source), **kw)


async def run(
    backend: JavaScriptBackend,
    source: str,
    language: ExecutionLanguage = JS,
    *,
    access: WorkspaceAccess | None = None,
    **kw: Any,
) -> tuple[ExecutionResult, list[OutputChunk]]:
    return await drain(backend.execute(request(backend, source, language, **kw), None, access))


# -- what it runs ------------------------------------------------------------------------------


async def test_a_js_module_returns_its_value(backend: JavaScriptBackend) -> None:
    result, chunks = await run(
        backend, "export default (input) => ({ sum: input.a + input.b });", input={"a": 1, "b": 2}
    )
    assert (result.status, result.reason, result.exit_code) == ("completed", "exit", 0)
    assert result.value == {"sum": 3} and result.stdout == b"" and chunks == []
    assert result.metadata is not None and result.metadata.language == JS


async def test_a_ts_module_with_types(backend: JavaScriptBackend) -> None:
    source = (
        "interface Pair { a: number; b: number }\n"
        "type Sum = { sum: number };\n"
        "export default async function (input: Pair): Promise<Sum> {\n"
        "  const total: number = input.a + input.b;\n"
        "  console.log(`adding ${input.a} and ${input.b}`);\n"
        "  return { sum: total };\n"
        "}\n"
    )
    result, chunks = await run(backend, source, TS, input={"a": 1, "b": 2})
    assert result.status == "completed", result.stderr
    assert result.value == {"sum": 3}
    assert (
        result.stdout == b"adding 1 and 2\n"
        and b"".join(c.data for c in chunks) == b"adding 1 and 2\n"
    )


async def test_console_and_values_without_a_function(backend: JavaScriptBackend) -> None:
    logged, _ = await run(backend, "console.log('hi'); console.error('oops');")
    assert (logged.status, logged.stdout, logged.stderr) == ("completed", b"hi\n", b"oops\n")
    assert not logged.has_value  # no default export: no value
    constant, _ = await run(backend, "export default [1, 'two', null];")
    assert constant.value == [1, "two", None]
    no_input, _ = await run(backend, "export default (input) => input === undefined;")
    assert no_input.value is True


async def test_a_value_json_cannot_hold_is_its_inspect_text(backend: JavaScriptBackend) -> None:
    result, _ = await run(backend, "export default () => 12n;")
    assert result.status == "completed" and result.value == "12n"
    assert [d.code for d in result.diagnostics] == ["valueNotJson"]


async def test_a_deeply_nested_value_fails_the_run_clearly(backend: JavaScriptBackend) -> None:
    """The attack: a value nested far deeper than ``max_depth`` (a recursive decode would
    raise RecursionError in the channel's handler and lose the run's report)."""
    source = (
        "export default () => { let v = []; for (let i = 0; i < 5000; i++) v = [v]; return v; }"
    )
    result, _ = await run(backend, source)
    assert (result.status, result.reason, result.exit_code) == ("failed", "exit", 1)
    assert [d.code for d in result.diagnostics] == ["tooDeep"]
    assert str(DEFAULT_LIMITS.max_depth) in result.diagnostics[0].message
    shallow, _ = await run(backend, "export default () => [[[[1]]]];")
    assert shallow.status == "completed" and shallow.value == [[[[1]]]]


async def test_a_deeply_nested_channel_line_fails_the_run_clearly(
    backend: JavaScriptBackend,
) -> None:
    """The attack: the program speaks to the channel socket itself with a ``[[[[…`` line; the
    run then fails with the reason, whatever it reports after. (The program waits until the
    host has hung up on that connection: its result travels on another connection, which the
    host could otherwise read first; a line the host never read cannot fail the run.)"""
    source = f"""
const c = await Deno.connect({{ transport: "unix", path: "{SOCKET}" }});
await c.write(new TextEncoder().encode("[".repeat(100000) + "\\n"));
while ((await c.read(new Uint8Array(16))) !== null) {{}}
c.close();
export default () => 1;
"""
    result, _ = await run(backend, source)
    assert (result.status, result.reason, result.exit_code) == ("failed", "exit", 1)
    assert [d.code for d in result.diagnostics] == ["tooDeep"]
    assert "channel message" in result.diagnostics[0].message


async def test_syntax_error_is_compile_failed(backend: JavaScriptBackend) -> None:
    result, _ = await run(backend, "export default (", TS)
    assert (result.status, result.reason, result.exit_code) == ("failed", "compileFailed", 1)
    assert result.diagnostics[0].code == "syntaxError"
    assert b"main.ts" in result.stderr and b"data:" not in result.stderr


async def test_an_exception_is_a_failed_exit_with_its_stack(backend: JavaScriptBackend) -> None:
    result, _ = await run(backend, "export default async () => { throw new RangeError('boom'); }")
    assert (result.status, result.reason, result.exit_code) == ("failed", "exit", 1)
    assert b"RangeError: boom" in result.stderr and b"main.js" in result.stderr
    assert result.diagnostics[0].message == "RangeError: boom"


async def test_modules_take_no_stdin_argv_env_or_other_language(
    backend: JavaScriptBackend,
) -> None:
    for field in ({"stdin": b"x"}, {"argv": ["a"]}):
        with pytest.raises(InvalidRequest):
            await run(backend, "export default 1;", **field)
    with pytest.raises(UnsupportedLanguage):
        await run(backend, "print(1)", ExecutionLanguage.PYTHON)


def test_deno_runs_with_no_permission_but_the_channel() -> None:
    argv = deno_argv("/deno", 64)
    granted = [a for a in argv if a.startswith("--allow")]
    assert granted == [
        "--allow-net=unix:/run/agora/host.sock",
        "--allow-read=/run/agora/host.sock",
        "--allow-write=/run/agora/host.sock",
    ]
    for flag in ("--no-prompt", "--no-remote", "--no-npm", "--cached-only", "--no-config"):
        assert flag in argv
    assert "--v8-flags=--max-old-space-size=64" in argv


def test_capabilities_are_truthful(backend: JavaScriptBackend) -> None:
    caps = backend.capabilities
    assert caps.languages == {JS, TS} and caps.workspace == "hostFunctions"
    assert caps.host_functions == {"readFile", "writeFile", "listFiles", "deleteFile"}
    assert caps.enforces_network and caps.enforces_filesystem and caps.enforces_environment
    assert caps.enforces_timeout and not caps.supports_process_execution
    assert backend.default_policy.network == "disabled"
    assert backend.default_policy.timeout_ms == 5_000  # strict_js


# -- the workspace host module -----------------------------------------------------------------


async def test_the_workspace_module_goes_through_the_access(backend: JavaScriptBackend) -> None:
    access = RecordingAccess({"notes/in.txt": b"hello"})
    source = (
        'import { readFile, writeFile, listFiles, deleteFile } from "agora:workspace";\n'
        "export default async () => {\n"
        '  const text = await readFile("notes/in.txt");\n'
        '  const n = await writeFile("notes/out.txt", text.toUpperCase());\n'
        '  const b = await writeFile("notes/bin", new Uint8Array([0, 255]));\n'
        '  const files = await listFiles("notes");\n'
        '  await deleteFile("notes/in.txt");\n'
        "  return { n, b, files };\n"
        "};\n"
    )
    result, _ = await run(backend, source, access=access)
    assert result.status == "completed", result.stderr
    assert result.value == {"n": 5, "b": 2, "files": ["notes/bin", "notes/in.txt", "notes/out.txt"]}
    assert access.calls == [
        ("read", "notes/in.txt"),
        ("write", "notes/out.txt", b"HELLO"),
        ("write", "notes/bin", b"\x00\xff"),
        ("list", "notes"),
        ("delete", "notes/in.txt"),
    ]


async def test_host_calls_follow_the_path_rules(backend: JavaScriptBackend) -> None:
    access = RecordingAccess({"a.txt": b"a"})
    source = (
        'import { readFile, writeFile } from "agora:workspace";\n'
        "const attempt = async (f) => { try { return await f(); } catch (e) { return e.name; } };\n"
        "export default async () => [\n"
        '  await attempt(() => readFile("/etc/passwd")),\n'
        '  await attempt(() => readFile("../outside")),\n'
        '  await attempt(() => readFile("missing.txt")),\n'
        '  await attempt(() => writeFile("a.txt", 42)),\n'
        "];\n"
    )
    result, _ = await run(backend, source, access=access)
    assert result.value == ["RangeError", "RangeError", "NotFound", "TypeError"], result.stderr
    assert access.calls == [("read", "missing.txt")]


async def test_writes_are_refused_and_skipped_on_a_read_only_instance(
    read_only: JavaScriptBackend,
) -> None:
    access = RecordingAccess({"a.txt": b"keep"})
    source = (
        'import { readFile, writeFile, deleteFile } from "agora:workspace";\n'
        "export default async () => {\n"
        "  const errors = [];\n"
        '  try { await writeFile("out.txt", "x"); } catch (e) { errors.push(e.name); }\n'
        '  try { await deleteFile("a.txt"); } catch (e) { errors.push(e.message); }\n'
        '  return { errors, kept: await readFile("a.txt") };\n'
        "};\n"
    )
    result, _ = await run(read_only, source, access=access)
    assert result.status == "completed", result.stderr
    assert result.value["errors"][0] == "PermissionDenied"
    assert "read-only access" in result.value["errors"][1] and result.value["kept"] == "keep"
    assert access.calls == [("read", "a.txt")]  # never asked to write
    assert result.skipped == [
        SkippedWrite(path="out.txt", mount_root=".", op="write", reason="read-only"),
        SkippedWrite(path="a.txt", mount_root=".", op="delete", reason="read-only"),
    ]
    assert result.finished_payload("x").skipped == result.skipped


# -- refused by the sandbox --------------------------------------------------------------------


async def test_the_sandbox_refuses_files_env_network_imports_and_processes(
    backend: JavaScriptBackend, listener: Listener
) -> None:
    source = f"""
const attempt = async (f) => {{
  try {{ await f(); return "allowed"; }} catch (e) {{ return `${{e.name}}: ${{e.message}}`; }}
}};
export default async () => ({{
  readTextFile: await attempt(() => Deno.readTextFile("/etc/passwd")),
  env: await attempt(() => Deno.env.get("HOME")),
  fetch: await attempt(() => fetch("http://127.0.0.1:{listener.port}/")),
  connect: await attempt(() => Deno.connect({{ hostname: "127.0.0.1", port: {listener.port} }})),
  remote: await attempt(() => import("https://deno.land/std/path/mod.ts")),
  npm: await attempt(() => import("npm:left-pad")),
  command: await attempt(() => new Deno.Command("/bin/sh", {{ args: ["-c", "id"] }}).output()),
  localFile: await attempt(() => import("file:///etc/passwd")),
  nodeFs: await attempt(async () => (await import("node:fs")).readFileSync("/etc/passwd")),
  dlopen: await attempt(() => Deno.dlopen("/lib/x86_64-linux-gnu/libc.so.6", {{}})),
}});
"""
    result, _ = await run(backend, source)
    assert result.status == "completed", result.stderr
    outcome: dict[str, str] = result.value
    assert "allowed" not in outcome.values(), outcome
    for case in ("readTextFile", "env", "fetch", "connect", "command", "localFile", "nodeFs"):
        assert outcome[case].startswith("NotCapable") or "Requires" in outcome[case], outcome
    assert "--no-remote" in outcome["remote"] and "--no-npm" in outcome["npm"]
    assert "root:" not in str(outcome)  # nothing of /etc/passwd came through
    assert await listener.settled() == 0


async def test_a_web_worker_has_no_permission_either(backend: JavaScriptBackend) -> None:
    worker = (
        'const code = \'try { await Deno.readTextFile("/etc/passwd"); postMessage("read"); }'
        " catch (e) { postMessage(e.name); }';\n"
        "export default async () => {\n"
        "  const w = new Worker('data:text/javascript,' + encodeURIComponent(code),"
        " { type: 'module' });\n"
        "  const got = await new Promise((done) => { w.onmessage = (e) => done(e.data); });\n"
        "  w.terminate();\n"
        "  return got;\n"
        "};\n"
    )
    result, _ = await run(backend, worker)
    assert (result.status, result.value) == ("completed", "NotCapable"), result.stderr
    # Asking for more for a worker is refused outright (an unstable API, not enabled).
    widened = (
        "new Worker('data:text/javascript,1', { type: 'module', deno: { permissions:"
        " { read: true } } });\nexport default 1;\n"
    )
    refused, _ = await run(backend, widened)
    assert refused.status == "failed" and not refused.has_value
    assert b"--unstable-worker-options" in refused.stderr


async def test_printing_the_oom_message_is_not_a_memory_limit(backend: JavaScriptBackend) -> None:
    result, _ = await run(
        backend, "console.error('Fatal JavaScript out of memory'); export default 1;"
    )
    assert (result.status, result.reason, result.value) == ("completed", "exit", 1)


async def test_an_infinite_loop_is_stopped_at_the_timeout(backend: JavaScriptBackend) -> None:
    async with asyncio.timeout(BOUND_S):
        result, _ = await run(backend, "export default () => { while (true) {} };", timeout_ms=800)
    assert (result.status, result.reason, result.exit_code) == ("failed", "timeout", 124)
    assert result.diagnostics[-1].code == "timeout"


@pytest.mark.parametrize(
    "allocation",
    [
        # 1 GiB of JS heap: V8's heap limit
        "const a = []; for (let i = 0; i < 1024; i++) a.push(new Array(131072).fill(i + 0.5));",
        # 1 GiB ArrayBuffer (outside V8's heap): the cgroup
        "const b = new Uint8Array(1024 * 1024 * 1024); b.fill(1);",
    ],
    ids=["heap", "arraybuffer"],
)
async def test_a_1_gib_allocation_is_stopped_at_the_memory_cap(
    backend: JavaScriptBackend, allocation: str
) -> None:
    assert backend.capabilities.enforces_memory
    source = f"export default () => {{ {allocation} console.log('allocated'); return 1; }};"
    result, _ = await run(
        backend, source, policy=backend.default_policy.replace(memory_bytes=128 * MIB)
    )
    assert (result.status, result.reason) == ("failed", "memoryLimit"), result
    assert b"allocated" not in result.stdout and not result.has_value


async def test_output_is_capped(backend: JavaScriptBackend) -> None:
    source = (
        "export default () => {\n"
        "  const line = 'x'.repeat(1000);\n"
        "  for (let i = 0; i < 5000; i++) console.log(line);\n"
        "};\n"
    )
    result, _ = await run(
        backend, source, policy=backend.default_policy.replace(max_stdout_bytes=MIB)
    )
    assert result.status == "completed"
    assert result.stdout_truncated and len(result.stdout) <= MIB and result.stdout_total > MIB


# -- lifecycle ---------------------------------------------------------------------------------


async def test_cancel_kills_the_run(backend: JavaScriptBackend) -> None:
    long = request(backend, "export default () => { while (true) {} };", timeout_ms=5_000)
    task = asyncio.create_task(collect(backend.execute(long, None)))
    await until_running(backend, long.exec_id)
    await asyncio.sleep(0.2)
    assert await backend.cancel(long.exec_id)
    result = await asyncio.wait_for(task, BOUND_S)
    assert (result.status, result.reason, result.exit_code) == ("cancelled", "killed", 130)


async def test_a_running_id_is_busy(backend: JavaScriptBackend) -> None:
    await assert_running_id_is_busy(
        backend, request(backend, "export default () => { while (true) {} };", timeout_ms=5_000)
    )


async def test_closed_backend_is_unavailable() -> None:
    made = await _started(JavaScriptBackend())
    await assert_closed_is_unavailable(made, request(made, "export default 1;"))


async def test_missing_deno_is_unavailable() -> None:
    made = JavaScriptBackend(deno="/nonexistent/deno")
    try:
        await made.start()
        ok, why = made.available()
        assert not ok and "pip install deno" in why
    finally:
        await made.aclose()


# -- through a real hub ------------------------------------------------------------------------

HUB_BACKENDS = """
[[backends]]
id = "js"
kind = "javascript"
access = "read-write"

[[backends]]
id = "js-ro"
kind = "javascript"
access = "read"
"""


@pytest.fixture
def starter(tmp_path: Path) -> Iterator[HubStarter]:
    made = HubStarter(tmp_path)
    try:
        yield made
    finally:
        made.close()


@pytest.fixture
def hub(starter: HubStarter) -> HubProcess:
    return starter.start(HUB_BACKENDS)


SLOW_ABC = (
    "const pause = () => new Promise((done) => setTimeout(done, 200));\n"
    "export default async () => {\n"
    "  console.log('a'); await pause(); console.log('b'); await pause(); console.log('c');\n"
    "  return 'abc';\n"
    "};\n"
)


async def test_journal_get_exec_and_dispose_through_the_hub(hub: HubProcess) -> None:
    async with exec_peer(hub.url) as p:
        result = await p.run(backend="js", language="javascript", source=SLOW_ABC, execId="j")
        full, end = await p.stream("w", "j", "full")
        after1, _ = await p.stream("w", "j", 1)
        tail, tail_end = await p.stream("w", "j", "tail")
        disposed = await p.call("dispose", workspace="w", execId="j")
        gone = await p.call("execResult", workspace="w", execId="j")
    assert (result["status"], result["value"], result["stdout"]) == (
        "completed",
        "abc",
        "a\nb\nc\n",
    )
    kinds = [f["event"]["kind"] for f in full]
    assert kinds == ["execRequested", "execStarted", *["execOutput"] * 3, "execFinished"]
    assert (end["op"], end["status"]) == ("execEnd", "completed")
    assert [f["event"]["payload"].get("n") for f in after1] == [2, 3, None]
    assert tail == [] and tail_end["status"] == "completed"
    assert disposed["op"] == "disposed" and gone["code"] == "notFound"


async def test_a_sigkilled_hub_is_reconciled_and_leaves_no_deno(
    starter: HubStarter, hub: HubProcess
) -> None:
    source = (
        "console.log('before');\n"
        "export default async () => { await new Promise((done) => setTimeout(done, 4000)); };\n"
    )
    async with exec_peer(hub.url) as p:
        accepted = await p.exec(backend="js", language="javascript", source=source, execId="k")
        assert accepted["op"] == "execAccepted", accepted
        async with asyncio.timeout(BOUND_S):
            while True:
                if of_kind(of_exec(await p.log(), "k"), "execOutput"):
                    break
                await asyncio.sleep(0.05)
    # This hub's sandboxes (the run's and the warm workers'): bwrap and deno.
    first = {line.split(":")[0] for line in processes_with("agora-js-")}
    assert first
    hub.kill()  # SIGKILL: no execFinished; --die-with-parent takes bwrap and deno down
    again = starter.start(HUB_BACKENDS, data_dir=hub.data_dir)
    async with exec_peer(again.url) as p:
        result = (await p.call("execResult", workspace="w", execId="k"))["result"]
    assert (result["status"], result["reason"]) == ("failed", "interrupted")
    assert result["stdout"] == "before\n"
    async with asyncio.timeout(BOUND_S):
        while True:
            if not first & {line.split(":")[0] for line in processes_with("agora-js-")}:
                break
            await asyncio.sleep(0.05)


async def test_write_file_from_js_is_an_event_another_agent_sees(hub: HubProcess) -> None:
    source = (
        'import { readFile, writeFile } from "agora:workspace";\n'
        "export default async (input: { n: number }) => {\n"
        '  const n = Number(await readFile("in.txt")) + input.n;\n'
        '  await writeFile("out.txt", `total ${n}`);\n'
        "  return { n };\n"
        "};\n"
    )
    async with exec_peer(hub.url) as alice, exec_peer(hub.url, mint_exec("bob")) as bob:
        await alice.publish(
            "w", {"kind": "fileWritten", "payload": {"path": "in.txt", "text": "40"}}
        )
        result = await alice.run(
            backend="js", language="typescript", source=source, input={"n": 2}, execId="js1"
        )
        assert (result["status"], result["value"], result["pulled"]) == ("completed", {"n": 42}, 1)
        log = await bob.log()
        state = await bob.call("state", workspace="w")
    requested = of_kind(of_exec(log, "js1"), "execRequested")[0]
    written = [e for e in log if e["kind"] == "fileWritten" and e["payload"]["path"] == "out.txt"]
    assert written[0]["causationId"] == requested["id"]
    assert written[0]["payload"]["text"] == "total 42" and written[0]["producer"] == "alice"
    assert "out.txt" in state["state"]["files"]
    kinds = [e["kind"] for e in of_exec(log, "js1")]
    assert kinds[0] == "execRequested" and kinds[-1] == "execFinished"


async def test_a_read_only_instance_refuses_and_skips_through_the_hub(hub: HubProcess) -> None:
    source = (
        'import { writeFile } from "agora:workspace";\n'
        "export default async () => {\n"
        '  try { await writeFile("out.txt", "x"); return "written"; }\n'
        "  catch (e) { return e.name; }\n"
        "};\n"
    )
    async with exec_peer(hub.url) as p:
        result = await p.run(backend="js-ro", language="javascript", source=source, execId="ro1")
        log = await p.log()
    assert (result["status"], result["value"], result["pulled"]) == (
        "completed",
        "PermissionDenied",
        0,
    )
    assert result["skipped"] == [
        {"path": "out.txt", "mountRoot": ".", "op": "write", "reason": "read-only"}
    ]
    assert not [e for e in log if e["kind"] == "fileWritten"]
    finished = of_kind(of_exec(log, "ro1"), "execFinished")[0]
    assert finished["payload"]["skipped"] == result["skipped"]


# -- the warm pool -----------------------------------------------------------------------------


async def _until_idle(backend: JavaScriptBackend, count: int) -> None:
    async with asyncio.timeout(BOUND_S):
        while True:
            if backend.idle_workers >= count:
                return
            await asyncio.sleep(0.01)


async def test_warm_workers_run_default_shaped_requests(tmp_path: Path) -> None:
    made = await _started(JavaScriptBackend(warm_workers=1))
    try:
        assert made.capabilities.pooled
        await _until_idle(made, 1)
        warm, _ = await run(made, "export default (i) => i * 2;", input=21)
        assert warm.value == 42 and warm.metadata is not None and warm.metadata.warm
        await _until_idle(made, 1)  # refilled
        # Another heap size than the pool's: a fresh deno started for it.
        other = made.default_policy.replace(memory_bytes=64 * MIB)
        cold, _ = await run(made, "export default (i) => i * 2;", input=21, policy=other)
        assert cold.value == 42 and cold.metadata is not None and not cold.metadata.warm
        # A warm worker is a fresh process per run: nothing survives from the last one.
        await run(made, "globalThis.kept = 1; export default 0;")
        await _until_idle(made, 1)
        second, _ = await run(made, "export default typeof globalThis.kept;")
        assert second.value == "undefined"
        stage = str(made._stage)
    finally:
        await made.aclose()
    assert processes_with(stage) == []  # the idle workers are gone with the backend


async def test_cold_only_backend_is_not_pooled() -> None:
    made = await _started(JavaScriptBackend(warm_workers=0))
    try:
        assert not made.capabilities.pooled
        result, _ = await run(made, "export default 1;")
        assert result.value == 1 and result.metadata is not None and not result.metadata.warm
        assert made.idle_workers == 0
    finally:
        await made.aclose()
