// An execution's stream (getExec) across a hub crash: the client asks again after the
// reconnect from the last output it got, and gets the rest once — the restart recovery's
// interrupted output and execFinished — with nothing delivered twice.
import assert from "node:assert/strict";
import { test } from "node:test";

import { connect } from "../dist/index.js";
import { name, startHub } from "./support/hub.mjs";

test(
  "an exec stream resumes across a hub restart without repeats",
  { timeout: 90_000 },
  async () => {
    const hub = await startHub();
    const session = await connect(
      hub.url,
      hub.token("runner", { rights: ["read", "write", "exec"], backends: ["process"] }),
      { backoff: { initial: 0.05, maximum: 0.5, giveUpAfter: 60 } },
    );
    try {
      const ws = session.workspace(name());
      const handle = await ws.runtime.exec("echo first; sleep 15", { backend: "process" });
      const updates = [];
      for await (const u of handle.events()) {
        updates.push(u);
        if (u.event.kind === "execOutput" && /first/.test(u.text ?? "")) {
          await hub.stop("SIGKILL"); // a crash while the program runs
          await hub.restart();
        }
      }
      const kinds = updates.map((u) => u.event.kind);
      const seqs = updates.map((u) => u.event.seq);
      assert.deepEqual(
        seqs,
        [...new Set(seqs)].sort((a, b) => a - b),
        "each event once, in order",
      );
      assert.equal(kinds.filter((k) => k === "execRequested").length, 1);
      assert.equal(kinds.filter((k) => k === "execStarted").length, 1);
      assert.equal(kinds.at(-1), "execFinished");
      const finished = updates.at(-1).event.payload;
      assert.equal(finished.status, "failed");
      assert.equal(finished.reason, "interrupted");
      assert.ok(session.reconnects >= 1);
    } finally {
      await session.close();
      await hub.close();
    }
  },
);
