// The TypeScript client's side of the failover tests (tests/hub/cluster/test_failover.py):
// a session given several nodes, driven by the Python test that kills a node under it.
//
//   node test/support/failover.mjs read  '{"urls": [...], "token": "…", "workspace": "w", "count": 60}'
//   node test/support/failover.mjs write '{"urls": [...], "token": "…", "workspace": "w", "count": 60, "window": 8}'
//
// One JSON object per line on stdout: `{"ready": url}` once subscribed (read) or connected
// (write), `{"progress": n}` after each event read or publish acknowledged, and a last line
// with the result. An error ends it with `{"error": code, "message": …}` and exit code 1.
import { connect } from "../../dist/index.js";

const FAST = { initial: 0.05, maximum: 0.3, giveUpAfter: 20 };

function say(value) {
  process.stdout.write(`${JSON.stringify(value)}\n`);
}

/** Read `count` messages of `workspace` from seq 0; then publish one through the node in use. */
async function read(session, { workspace, count }) {
  const sub = session.workspace(workspace).subscribe(0);
  const seqs = [];
  const texts = [];
  say({ ready: session.url });
  for await (const event of sub) {
    seqs.push(event.seq);
    if (event.kind !== "messagePosted") continue;
    texts.push(event.payload.text);
    say({ progress: texts.length });
    if (texts.length >= count) break;
  }
  const after = await session.workspace(workspace).postMessage("after the move");
  return { seqs, texts, after: after.seq };
}

/** Publish `count` messages with `window` in flight; every ack's (id, seq). */
async function write(session, { workspace, count, window }) {
  const ws = session.workspace(workspace);
  const acks = [];
  say({ ready: session.url });
  let next = 0;
  async function lane() {
    while (next < count) {
      const i = next;
      next += 1;
      const ack = await ws.publish({ kind: "messagePosted", payload: { text: `ts-${i}` } });
      acks.push([ack.id, ack.seq]);
      say({ progress: acks.length });
    }
  }
  await Promise.all(Array.from({ length: window }, lane));
  return { acks };
}

const [mode, json] = process.argv.slice(2);
const args = JSON.parse(json);
const session = await connect(args.urls, args.token, { backoff: FAST });
try {
  const result = mode === "read" ? await read(session, args) : await write(session, args);
  say({ ...result, url: session.url, reconnects: session.reconnects });
} catch (e) {
  say({ error: e.code ?? "internal", message: String(e.message ?? e) });
  process.exitCode = 1;
} finally {
  await session.close();
}
