"""Sandbox latency: the in-process backends, Deno and the Rust pipeline beside the process floor.

    python bench/sandbox_bench.py [--runs N] [--quick] [--no-rust]

Every row is the wall time of one ``execute`` drained to its result (``collect``), measured
from the caller (event loop hops and validation included), median and p90 over N runs after
one warm-up run:

* ``process  /bin/true`` — the floor of a host process (``process`` backend, network
  namespace when available): fork/exec, pipes, reaping.
* ``process  python -c`` — the same backend running the hub's interpreter (what untrusted
  Python would cost there, unsandboxed).
* ``wasm  warm`` — a cached WASI module (hello world): instantiate + ``_start`` on a worker
  thread; ``wasm  cold`` — the same with a module the cache has not seen (compilation
  included).
* ``python  exec`` — a pydantic-monty snippet with ``input``/``value`` (pooled worker).
* ``js  cold`` — a JavaScript module on the ``javascript`` backend (Deno) without a pool: a
  fresh confined ``deno`` process per run; ``js  ts cold`` — the same with a TypeScript module;
  ``js  in-deno part of cold`` — of the cold runs, only the time from deno asking for its run
  to its result (the channel's timestamps); ``js  warm`` — the default (pooled) instance, a
  warm worker idle before each run (a burst beyond the pool's size runs cold).
* ``rust  cold`` — check + build + run of a source not in the build cache;
  ``rust  cached`` — the same source again (build cache hit: only the run).

The ratio column compares each row with the process floor.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import sys
import time
import uuid
from collections.abc import Awaitable, Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from backends.base import (
    CodeExecutor,
    ExecutionLanguage,
    ExecutionRequest,
    GuestModule,
    Source,
    collect,
)
from backends.javascript import JavaScriptBackend
from backends.monty import PythonBackend
from backends.process import ProcessBackend
from backends.wasm import WasmBackend
from tests.backends import wat

RUST_SOURCE = """
fn run(input: serde_json::Value) -> serde_json::Value {
    serde_json::json!({"double": input["n"].as_i64().unwrap_or(0) * 2})
}
"""


async def timed(make: Callable[[], Awaitable[object]], runs: int, warmup: int = 1) -> list[float]:
    for _ in range(warmup):
        await make()
    samples = []
    for _ in range(runs):
        began = time.perf_counter()
        await make()
        samples.append((time.perf_counter() - began) * 1000)
    return samples


def ids() -> str:
    return f"bench-{uuid.uuid4().hex[:12]}"


async def one(backend: CodeExecutor, **kw: object) -> None:
    kw.setdefault("exec_id", ids())
    kw.setdefault("policy", backend.default_policy)
    result = await collect(backend.execute(ExecutionRequest(**kw), None))  # type: ignore[arg-type]
    if result.status != "completed":
        raise RuntimeError(f"benchmark run failed: {result}")


async def bench(runs: int, rust: bool) -> list[tuple[str, list[float]]]:
    rows: list[tuple[str, list[float]]] = []
    async with ProcessBackend() as process:  # confined (bubblewrap), network off
        policy = process.default_policy
        rows.append(
            (
                "process  /bin/true",
                await timed(lambda: one(process, payload=Source("/bin/true"), policy=policy), runs),
            )
        )
        rows.append(
            (
                "process  python -c",
                await timed(
                    lambda: one(
                        process,
                        language=ExecutionLanguage.PYTHON,
                        payload=Source("import json,sys; print(json.dumps(1+1))"),
                        policy=policy,
                    ),
                    max(3, runs // 4),
                ),
            )
        )
    async with WasmBackend() as wasm:
        hello = wat.wasm(wat.HELLO)
        rows.append(
            (
                "wasm     warm",
                await timed(
                    lambda: one(wasm, language=ExecutionLanguage.WASM, payload=GuestModule(hello)),
                    runs,
                ),
            )
        )

        def fresh() -> bytes:
            return wat.wasm(wat.HELLO.replace("hello from wasi", uuid.uuid4().hex[:15]))

        rows.append(
            (
                "wasm     cold (compile)",
                await timed(
                    lambda: one(
                        wasm, language=ExecutionLanguage.WASM, payload=GuestModule(fresh())
                    ),
                    max(3, runs // 4),
                    warmup=0,
                ),
            )
        )
    js_module = Source("export default (input) => ({ n: input.n * 2 });")
    ts_module = Source(
        "export default (input: { n: number }): { n: number } => ({ n: input.n * 2 });"
    )
    async with JavaScriptBackend(warm_workers=0) as js:
        ok, why = js.available()
        if not ok:
            raise RuntimeError(f"the javascript backend is unavailable: {why}")
        for name, language, module in (
            ("js       cold (deno per run)", ExecutionLanguage.JAVASCRIPT, js_module),
            ("js       ts cold", ExecutionLanguage.TYPESCRIPT, ts_module),
        ):
            js.timings.clear()
            rows.append(
                (
                    name,
                    await timed(
                        lambda language=language, module=module: one(
                            js, language=language, payload=module, input={"n": 21}
                        ),
                        runs,
                    ),
                )
            )
            if language == ExecutionLanguage.JAVASCRIPT:
                inside = [after for _, after in list(js.timings)[1:]]
                rows.append(("js       in-deno part of cold", inside))
    async with JavaScriptBackend(warm_workers=1) as js:
        samples = []
        for i in range(runs + 1):
            async with asyncio.timeout(60):  # a warm worker is idle before each timed run
                while True:
                    if js.idle_workers >= 1:
                        break
                    await asyncio.sleep(0.005)
            began = time.perf_counter()
            await one(js, language=ExecutionLanguage.JAVASCRIPT, payload=js_module, input={"n": 21})
            if i:  # the first is the warm-up
                samples.append((time.perf_counter() - began) * 1000)
        rows.append(("js       warm (pooled worker)", samples))
    async with PythonBackend() as python:
        rows.append(
            (
                "python   exec (monty)",
                await timed(
                    lambda: one(
                        python,
                        language=ExecutionLanguage.PYTHON,
                        payload=Source("input['n'] * 2"),
                        input={"n": 21},
                    ),
                    runs,
                ),
            )
        )
    if rust:
        from backends.rust import RustBackend, RustSettings

        # This script is its own composition root: the toolchain from its environment.
        async with RustBackend(settings=RustSettings().resolved(os.environ)) as backend:
            await backend.prepare()

            def source() -> str:
                return f"// {uuid.uuid4()}\n{RUST_SOURCE}"

            rows.append(
                (
                    "rust     cold (check+build+run)",
                    await timed(
                        lambda: one(
                            backend,
                            language=ExecutionLanguage.RUST,
                            payload=Source(source()),
                            input={"n": 2},
                        ),
                        max(3, runs // 10),
                        warmup=0,
                    ),
                )
            )
            cached = source()
            rows.append(
                (
                    "rust     cached (run only)",
                    await timed(
                        lambda: one(
                            backend,
                            language=ExecutionLanguage.RUST,
                            payload=Source(cached),
                            input={"n": 2},
                        ),
                        runs,
                    ),
                )
            )
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=50, help="runs per row (default 50)")
    parser.add_argument("--quick", action="store_true", help="10 runs per row")
    parser.add_argument("--no-rust", action="store_true", help="skip the Rust rows")
    args = parser.parse_args(argv)
    runs = 10 if args.quick else args.runs
    rows = asyncio.run(bench(runs, not args.no_rust))
    floor = statistics.median(rows[0][1])
    header = f"{'backend / case':34} {'median ms':>10} {'p90 ms':>9} {'runs':>5} {'vs process':>11}"
    print(header)
    print("-" * len(header))
    for name, samples in rows:
        median = statistics.median(samples)
        p90 = sorted(samples)[max(0, int(len(samples) * 0.9) - 1)]
        print(f"{name:34} {median:10.2f} {p90:9.2f} {len(samples):5d} {median / floor:10.2f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())
