#!/usr/bin/env node
// publish -> ack latency of the TypeScript client: one publish at a time (a messagePosted of
// 64 characters, client-minted id), timed from the call to the resolved ack with
// performance.now(). Driven by bench/ts_client_bench.py; prints one JSON line:
//   {"client": "typescript", "n": N, "latenciesMs": [...]}
//
//   node bench/publish.mjs URL TOKEN WORKSPACE N [WARMUP]
import { connect } from "../dist/index.js";

const [url, token, workspace, n, warmup] = process.argv.slice(2);
const count = Number(n);
const warm = Number(warmup ?? 50);
const text = "x".repeat(64);
const session = await connect(url, token);
const ws = session.workspace(workspace);
for (let i = 0; i < warm; i += 1) await ws.postMessage(text);
const latencies = [];
for (let i = 0; i < count; i += 1) {
  const start = performance.now();
  await ws.publish({ kind: "messagePosted", payload: { text } });
  latencies.push(performance.now() - start);
}
await session.close();
process.stdout.write(
  `${JSON.stringify({ client: "typescript", n: count, latenciesMs: latencies })}\n`,
);
