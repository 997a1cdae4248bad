// The client over the global WebSocket (the browser API; Node's is undici's WHATWG
// implementation, behind --experimental-websocket on Node 20) instead of `ws`.
import assert from "node:assert/strict";
import { execFile } from "node:child_process";
import { fileURLToPath } from "node:url";
import { promisify } from "node:util";
import { after, before, test } from "node:test";

import { name, startHub } from "./support/hub.mjs";

const run = promisify(execFile);
const SCRIPT = fileURLToPath(new URL("./support/browser-socket.mjs", import.meta.url));

let hub;
before(async () => {
  hub = await startHub();
});
after(async () => {
  await hub.close();
});

test("the session works over the global (browser) WebSocket", { timeout: 60_000 }, async () => {
  const flags = typeof WebSocket === "undefined" ? ["--experimental-websocket"] : [];
  const room = name("browser");
  const { stdout } = await run(
    process.execPath,
    [...flags, "--no-warnings", SCRIPT, hub.url, hub.token("carol"), room],
    { timeout: 50_000 },
  );
  const out = JSON.parse(stdout.trim().split("\n").pop());
  assert.equal(out.agent, "carol");
  assert.equal(out.seq, 1);
  assert.ok(out.kinds.includes("messagePosted"));
  assert.deepEqual(out.bytes, [1, 2, 3]);
});
