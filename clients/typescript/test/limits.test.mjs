// The client at the hub's limits: a reader too slow for its send queue is cut with 4408 and
// resumes where the hub stopped (no gap, no duplicate); rate-limited publishes are retried
// after the hub's retryAfterMs, or refused as RateLimited when the session says not to retry.
import assert from "node:assert/strict";
import { test } from "node:test";

import { WebSocket } from "ws";

import { RateLimited, connect } from "../dist/index.js";
import { name, startHub } from "./support/hub.mjs";

test(
  "a reader cut with 4408 (too slow) resumes with every event once",
  { timeout: 120_000 },
  async () => {
    const hub = await startHub("[limits]\nsend_queue = 16\n");
    const sockets = [];
    const factory = (url, protocols, maxPayload) => {
      const socket = new WebSocket(url, protocols, { maxPayload });
      sockets.push(socket);
      return socket;
    };
    const slow = await connect(hub.url, hub.token("slow"), { socketFactory: factory });
    const fast = await connect(hub.url, hub.token("fast"));
    try {
      const room = name("slow");
      const sub = slow.workspace(room).subscribe(0);
      await sub.head();
      const tcp = sockets.at(-1)._socket; // the consumer stops reading its socket
      tcp.pause();
      const body = "x".repeat(30_000); // ~30 kB an event: the socket buffers fill quickly
      const count = 400;
      const ws = fast.workspace(room);
      for (let start = 0; start < count; start += 20) {
        const batch = [];
        for (let i = start; i < start + 20; i += 1) {
          batch.push({ kind: "messagePosted", payload: { text: `${i}:${body}` } });
        }
        await ws.publishBatch(batch);
      }
      await new Promise((r) => setTimeout(r, 500));
      tcp.resume();
      const got = [];
      for await (const ev of sub) {
        got.push(ev);
        if (ev.kind === "messagePosted" && ev.payload.text.startsWith(`${count - 1}:`)) break;
      }
      const seqs = got.map((e) => e.seq);
      assert.deepEqual(
        seqs,
        seqs.map((_, i) => i + 1),
        "contiguous from 1: no gap, no duplicate",
      );
      const numbers = got
        .filter((e) => e.kind === "messagePosted")
        .map((e) => Number(e.payload.text.split(":")[0]));
      assert.deepEqual(numbers, [...Array(count).keys()]);
      assert.ok(slow.reconnects >= 1);
      assert.equal(slow.lastClose?.code, 4408);
    } finally {
      await slow.close();
      await fast.close();
      await hub.close();
    }
  },
);

test(
  "rateLimited publishes are retried after retryAfterMs; or refused",
  { timeout: 60_000 },
  async () => {
    const hub = await startHub("[limits]\npublish_rate = 20.0\npublish_burst = 5\n");
    const patient = await connect(hub.url, hub.token("patient"));
    const hasty = await connect(hub.url, hub.token("hasty"), { retryRateLimited: false });
    try {
      const ws = patient.workspace(name());
      const acks = await Promise.all([...Array(12).keys()].map((i) => ws.postMessage(`m${i}`)));
      assert.equal(new Set(acks.map((a) => a.seq)).size, 12);
      const hw = hasty.workspace(name());
      const results = await Promise.allSettled(
        [...Array(12).keys()].map((i) => hw.postMessage(`h${i}`)),
      );
      const refused = results.filter((r) => r.status === "rejected");
      assert.ok(refused.length > 0);
      for (const r of refused) {
        assert.ok(r.reason instanceof RateLimited);
        assert.equal(typeof r.reason.details.retryAfterMs, "number");
      }
    } finally {
      await patient.close();
      await hasty.close();
      await hub.close();
    }
  },
);

test(
  "the same close again and again ends the session (no silent endless reconnect)",
  { timeout: 60_000 },
  async () => {
    const hub = await startHub("[limits]\nmax_connections_per_agent = 1\n");
    const first = await connect(hub.url, hub.token("solo"));
    const second = await connect(hub.url, hub.token("solo"), {
      backoff: { initial: 0.02, maximum: 0.1, giveUpAfter: 30 },
      maxIdenticalCloses: 3,
    });
    try {
      // Every connection of the second session gets welcome, then busy and 1013.
      const sub = second.workspace(name()).subscribe(0);
      await assert.rejects(
        (async () => {
          for await (const _ of sub) {
            // nothing arrives
          }
        })(),
        (e) => {
          assert.equal(e.code, "unavailable");
          assert.equal(e.details.closeCode, 1013);
          assert.equal(e.details.repeats, 3);
          return true;
        },
      );
      assert.equal(second.closed, true);
      // The first session is untouched.
      assert.equal((await first.workspace(name()).postMessage("still")).seq, 1);
    } finally {
      await first.close();
      await second.close();
      await hub.close();
    }
  },
);
