// Resume across a hub restart: a subscriber reading while its hub is killed (SIGKILL) and
// shut down (SIGTERM, 1001) and restarted on the same port and data gets every event once,
// in order — no gap, no duplicate — and a publisher's retried publishes are idempotent.
import assert from "node:assert/strict";
import { test } from "node:test";

import { connect } from "../dist/index.js";
import { name, startHub } from "./support/hub.mjs";

const FAST = { backoff: { initial: 0.05, maximum: 0.5, giveUpAfter: 60 } };

/** Options whose sockets go to a closed port while `gate.away` is set: the reader stays away
 * until the writer has written, so those events are only in the log and the reader must
 * resume from the seq it holds to get them. */
async function gated(gate) {
  const { WebSocket } = await import("ws");
  const factory = (url, protocols, maxPayload) =>
    new WebSocket(gate.away ? "ws://127.0.0.1:9" : url, protocols, { maxPayload });
  return { ...FAST, socketFactory: factory };
}

async function collect(sub, count, seen) {
  for await (const ev of sub) {
    if (ev.kind !== "messagePosted") continue;
    seen.push(ev);
    if (seen.length >= count) return;
  }
}

for (const signal of ["SIGKILL", "SIGTERM"]) {
  test(
    `subscribe resumes across a hub restart (${signal}): no gap, no duplicate`,
    { timeout: 60_000 },
    async () => {
      const hub = await startHub();
      const gate = { away: false };
      const reader = await connect(hub.url, hub.token("reader"), await gated(gate));
      const writer = await connect(hub.url, hub.token("writer"), FAST);
      try {
        const room = name("resume");
        const ws = writer.workspace(room);
        const seen = [];
        const sub = reader.workspace(room).subscribe(0);
        const done = collect(sub, 60, seen);
        const acks = [];
        for (let i = 0; i < 30; i += 1) acks.push(await ws.postMessage(`before ${i}`));
        // Wait until the reader has some (not necessarily all) of them, then crash the hub.
        const until = Date.now() + 10_000;
        while (seen.length < 10 && Date.now() < until) await new Promise((r) => setTimeout(r, 10));
        gate.away = true;
        await hub.stop(signal);
        // Publishes sent while the hub is down wait for the reconnect and are sent then.
        const pending = [];
        for (let i = 0; i < 10; i += 1) pending.push(ws.postMessage(`during ${i}`));
        await hub.restart();
        acks.push(...(await Promise.all(pending)));
        assert.equal(reader.reconnects, 0, "the reader is still away while the writer writes");
        gate.away = false;
        for (let i = 0; i < 20; i += 1) acks.push(await ws.postMessage(`after ${i}`));
        await done;
        sub.close();

        assert.ok(reader.reconnects >= 1 && writer.reconnects >= 1);
        const seqs = seen.map((e) => e.seq);
        assert.equal(new Set(seqs).size, seqs.length, "no duplicate");
        assert.deepEqual(
          seqs,
          [...seqs].sort((a, b) => a - b),
          "in order",
        );
        // Exactly the acknowledged events, in log order: every ack's id is there once.
        assert.deepEqual(
          seen.map((e) => e.id),
          [...acks].sort((a, b) => a.seq - b.seq).map((a) => a.id),
        );
        // No gap: the seqs between the reader's events are the hub's own (presence) events.
        const all = await writer.workspace(room).events(0);
        const messages = all.filter((e) => e.kind === "messagePosted").map((e) => e.seq);
        assert.deepEqual(seqs, messages);
        assert.deepEqual(
          all.map((e) => e.seq),
          all.map((_, i) => i + 1),
        );
      } finally {
        await reader.close();
        await writer.close();
        await hub.close();
      }
    },
  );
}

test("a publish retried with the same id is acknowledged as a duplicate, same seq", async () => {
  const hub = await startHub();
  const session = await connect(hub.url, hub.token("alice"));
  try {
    const ws = session.workspace(name());
    const draft = { id: "fixed-id-1", kind: "messagePosted", payload: { text: "once" } };
    const first = await ws.publish(draft);
    const again = await ws.publish(draft);
    assert.equal(first.duplicate, false);
    assert.equal(again.duplicate, true);
    assert.equal(again.seq, first.seq);
    const minted = await ws.publish({ kind: "messagePosted", payload: { text: "minted" } });
    assert.match(minted.id, /^[0-9a-f-]{36}$/);
    const batch = await ws.publishBatch([
      { kind: "messagePosted", payload: { text: "a" } },
      { kind: "messagePosted", payload: { text: "b" } },
    ]);
    assert.deepEqual(batch.seqs, [minted.seq + 1, minted.seq + 2]);
    assert.equal((await ws.events(0)).filter((e) => e.kind === "messagePosted").length, 4);
  } finally {
    await session.close();
    await hub.close();
  }
});
