// The workspace API against a real `agora serve`: state, files with baseRev, the work
// verbs, waiters that read the log first, exec with streaming output.
import assert from "node:assert/strict";
import { after, before, test } from "node:test";

import { Conflict, Forbidden, NotFound, WaitTimeout, connect } from "../dist/index.js";
import { name, startHub } from "./support/hub.mjs";

let hub;
before(async () => {
  hub = await startHub();
});
after(async () => {
  await hub.close();
});

async function session(agent, options) {
  return connect(hub.url, hub.token(agent, options));
}

test(
  "files: write with baseRev, stale baseRev is a Conflict, read, move, delete",
  { timeout: 30_000 },
  async () => {
    const alice = await session("alice");
    try {
      const ws = alice.workspace(name());
      await ws.writeFile("src/a.txt", "one", 0);
      await assert.rejects(ws.writeFile("src/a.txt", "again", 0), (e) => {
        assert.ok(e instanceof Conflict);
        assert.equal(e.details.rev, 1);
        return true;
      });
      await ws.writeFile("src/a.txt", "two", 1);
      assert.equal(await ws.readFile("src/a.txt"), "two");
      await ws.writeFile("bin/b", new Uint8Array([0, 255, 7]));
      assert.deepEqual([...(await ws.readFile("bin/b"))], [0, 255, 7]);
      const state = await ws.state();
      assert.equal(state.files["src/a.txt"].rev, 2);
      assert.equal(state.files["src/a.txt"].text, undefined, "metadata only without contents");
      await ws.moveFile("src/a.txt", "src/c.txt", 2);
      await ws.deleteFile("bin/b");
      await assert.rejects(ws.readFile("bin/b"), (e) => e instanceof NotFound);
      const later = await ws.state();
      assert.deepEqual(Object.keys(later.files), ["src/c.txt"]);
      const past = await ws.state({ atSeq: state.seq });
      assert.deepEqual(Object.keys(past.files).sort(), ["bin/b", "src/a.txt"]);
    } finally {
      await alice.close();
    }
  },
);

test(
  "work verbs and waiters: a reply published before the wait is found",
  { timeout: 30_000 },
  async () => {
    const room = name();
    const boss = await session("boss");
    const worker = await session("worker");
    try {
      const bws = boss.workspace(room);
      const wws = worker.workspace(room);
      const item = await bws.requestWork("parser", { spec: "parse it" });
      const found = await wws.waitForWork("parser", { timeout: 10 });
      assert.equal(found.correlationId, item.correlationId);
      assert.equal(found.producer, "boss");
      await wws.claimWork(item.correlationId);
      // Another agent may not publish on an item it does not own.
      await assert.rejects(
        bws.publishWork(item.correlationId, { x: 1 }),
        (e) => e instanceof Forbidden,
      );
      await assert.rejects(bws.claimWork(item.correlationId), (e) => e instanceof Conflict);
      await wws.publishWork(item.correlationId, { result: 42 });
      // Published before the wait started: the waiter reads the log first.
      const reply = await bws.waitForKind(item.correlationId, "workPublished", { timeout: 10 });
      assert.deepEqual(reply.payload, { result: 42 });
      assert.equal(reply.topic, "parser");
      // Feedback round trip, waiting first this time.
      const asked = bws.waitForFeedback(item.correlationId, { timeout: 10, afterSeq: reply.seq });
      await wws.requestFeedback(item.correlationId, { q: "ok?" });
      await bws.provideFeedback(item.correlationId, { a: "yes" });
      const fb = await asked;
      assert.equal(fb.producer, "boss");
      await wws.signalCompleted(item.correlationId, { done: true });
      const state = await bws.state();
      assert.equal(state.workItems[item.correlationId].status, "completed");
      // Nothing open any more: waiting for work times out.
      await assert.rejects(
        wws.waitForWork("parser", { timeout: 0.5 }),
        (e) => e instanceof WaitTimeout,
      );
      await assert.rejects(
        bws.waitForKind(item.correlationId, "blocked", { timeout: 0.3 }),
        (e) => e.name === "TimeoutError",
      );
    } finally {
      await boss.close();
      await worker.close();
    }
  },
);

test(
  "subscribers share one wire subscription and each reads from its own seq",
  { timeout: 30_000 },
  async () => {
    const alice = await session("alice");
    try {
      const ws = alice.workspace(name());
      for (let i = 0; i < 5; i += 1) await ws.postMessage(`m${i}`);
      const a = ws.subscribe(0);
      const b = ws.subscribe(3);
      const live = ws.subscribe();
      const head = await live.head();
      await ws.postMessage("live");
      const take = async (sub, n) => {
        const out = [];
        for await (const ev of sub) {
          out.push(ev.seq);
          if (out.length === n) break;
        }
        return out;
      };
      assert.deepEqual(await take(a, 3), [1, 2, 3]);
      assert.deepEqual(await take(b, 2), [4, 5]);
      let ev = null;
      for await (const e of live) {
        assert.ok(e.seq > head);
        if (e.kind === "messagePosted") {
          ev = e;
          break;
        }
      }
      assert.equal(ev.payload.text, "live");
      assert.ok((await ws.head()) >= ev.seq); // presence (memberJoined) may land after it
    } finally {
      await alice.close();
    }
  },
);

test("exec: streaming output, the result, kill and dispose", { timeout: 60_000 }, async () => {
  const runner = await session("runner", {
    rights: ["read", "write", "exec"],
    backends: ["process"],
  });
  try {
    const ws = runner.workspace(name());
    const handle = await ws.runtime.exec("echo one; echo two >&2; echo three", {
      backend: "process",
    });
    const updates = [];
    for await (const u of handle.events()) updates.push(u);
    const kinds = updates.map((u) => u.event.kind);
    assert.equal(kinds[0], "execRequested");
    assert.equal(kinds.at(-1), "execFinished");
    const text = updates
      .filter((u) => u.event.kind === "execOutput")
      .map((u) => u.text)
      .join("");
    assert.match(text, /one/);
    assert.match(text, /three/);
    const again = ws.runtime.getExec(handle.id);
    const result = await again.result();
    assert.equal(result.status, "completed");
    assert.equal(result.exitCode, 0);
    assert.equal(result.stdout, "one\nthree\n");
    assert.equal(result.stderr, "two\n");
    const slow = await ws.runtime.exec("sleep 30", { backend: "process" });
    assert.equal(await slow.kill(), "cancelled");
    await ws.runtime.disposeExec(handle.id);
    await assert.rejects(ws.runtime.getExec(handle.id).result(), (e) => e instanceof NotFound);
  } finally {
    await runner.close();
  }
});

test("publishes without an id get time-ordered ids (UUIDv7)", async () => {
  const alice = await session("alice");
  try {
    const ws = alice.workspace(name());
    const before = Date.now();
    const ids = [];
    for (let i = 0; i < 3; i += 1) {
      ids.push((await ws.publish({ kind: "messagePosted", payload: { text: String(i) } })).id);
    }
    const after = Date.now();
    for (const id of ids) {
      assert.match(id, /^[0-9a-f]{8}-[0-9a-f]{4}-7[0-9a-f]{3}-[89ab][0-9a-f]{3}-[0-9a-f]{12}$/);
      const ms = parseInt(id.replaceAll("-", "").slice(0, 12), 16);
      assert.ok(before <= ms && ms <= after, `${ms} within [${before}, ${after}]`);
    }
    const stored = (await ws.events(0)).filter((e) => e.kind === "messagePosted");
    assert.deepEqual(
      stored.map((e) => e.id),
      ids,
    );
  } finally {
    await alice.close();
  }
});

test("invalid drafts are refused before sending: nothing is written", async () => {
  const alice = await session("alice");
  try {
    const ws = alice.workspace(name());
    await assert.rejects(ws.writeFile("a.txt", undefined), (e) => e.details.field === "content");
    await assert.rejects(
      ws.publish({ kind: "messagePosted", seq: 3 }),
      (e) => e.details.field === "seq",
    );
    await assert.rejects(ws.publishBatch([]), (e) => e.details.field === "events");
    assert.throws(
      () => ws.subscribe(-1),
      (e) => e.details.field === "afterSeq",
    );
    assert.deepEqual(await ws.events(0), []);
  } finally {
    await alice.close();
  }
});

test(
  "a subscriber behind the window is replayed from the log (rewind)",
  { timeout: 30_000 },
  async () => {
    const alice = await connect(hub.url, hub.token("alice"), { history: 8 });
    try {
      const ws = alice.workspace(name());
      const live = ws.subscribe(); // keeps the feed going while the old reader lags
      await live.head();
      const acks = [];
      for (let i = 0; i < 40; i += 1) acks.push(await ws.postMessage(`m${i}`));
      const all = [];
      for await (const ev of ws.subscribe(0)) {
        all.push(ev.seq);
        if (ev.seq >= acks.at(-1).seq) break;
      }
      assert.deepEqual(
        all,
        all.map((_, i) => i + 1),
      );
      live.close();
    } finally {
      await alice.close();
    }
  },
);

test(
  "pipelined publishes from one session are appended in the order sent",
  { timeout: 30_000 },
  async () => {
    const alice = await session("alice");
    try {
      const ws = alice.workspace(name());
      const acks = await Promise.all([...Array(50).keys()].map((i) => ws.postMessage(`p${i}`)));
      const seqs = acks.map((a) => a.seq);
      assert.deepEqual(
        seqs,
        [...seqs].sort((a, b) => a - b),
      );
      assert.equal(new Set(seqs).size, 50);
    } finally {
      await alice.close();
    }
  },
);

test(
  "over max_subscriptions an idle followed workspace makes room",
  { timeout: 60_000 },
  async () => {
    const small = await startHub("[limits]\nmax_subscriptions = 2\n");
    const alice = await connect(small.url, small.token("alice"));
    try {
      const names = [name(), name(), name()];
      for (const n of names) await alice.workspace(n).postMessage("x");
      // Each head() follows the workspace and leaves its feed idle but subscribed.
      assert.ok((await alice.workspace(names[0]).head()) >= 1);
      assert.ok((await alice.workspace(names[1]).head()) >= 1);
      const events = await alice.workspace(names[2]).events(0);
      assert.equal(events[0].payload.text, "x");
    } finally {
      await alice.close();
      await small.close();
    }
  },
);
