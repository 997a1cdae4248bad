// The session against a real `agora serve`: hello, token refresh, typed errors.
import assert from "node:assert/strict";
import { after, before, test } from "node:test";

import { createServer } from "node:net";

import {
  BadRequest,
  Forbidden,
  Unauthorized,
  Unavailable,
  connect,
  ERROR_CODES,
} from "../dist/index.js";
import { mint, name, startHub } from "./support/hub.mjs";

let hub;
before(async () => {
  hub = await startHub();
});
after(async () => {
  await hub.close();
});

test("hello: the welcome names the agent and its rights", async () => {
  const session = await connect(hub.url, hub.token("alice"));
  try {
    assert.equal(session.agent, "alice");
    assert.deepEqual([...session.rights].sort(), ["read", "write"]);
    assert.match(session.server, /^agora\//);
    assert.ok(session.expiresAt > Date.now() / 1000);
  } finally {
    await session.close();
  }
});

test("a forged or expired token is Unauthorized with the hub's reason", async () => {
  await assert.rejects(connect(hub.url, mint("alice", { secret: "x".repeat(40) })), (e) => {
    assert.ok(e instanceof Unauthorized);
    assert.equal(e.code, "unauthorized");
    assert.equal(e.details.reason, "invalid_signature");
    return true;
  });
  await assert.rejects(connect(hub.url, "not-a-jwt"), (e) => e instanceof Unauthorized);
});

test("refresh: a fresh token for the same agent is taken, another agent's is Forbidden", async () => {
  const session = await connect(hub.url, hub.token("alice", { ttl: 120 }));
  try {
    const before = session.expiresAt;
    await session.refresh(hub.token("alice", { ttl: 3600 }));
    assert.ok(session.expiresAt > before);
    await assert.rejects(session.refresh(hub.token("mallory")), (e) => e instanceof Forbidden);
    // The session is still usable after the refused refresh (the old token stays in force).
    const ack = await session.workspace(name()).postMessage("still here");
    assert.equal(ack.seq, 1);
  } finally {
    await session.close();
  }
});

test("tokenProvider: the session refreshes before the token expires", async () => {
  let calls = 0;
  const session = await connect(hub.url, hub.token("alice", { ttl: 63 }), {
    refreshMargin: 62, // expiresAt - 62 s: about a second from now
    tokenProvider: () => {
      calls += 1;
      return hub.token("alice", { ttl: 3600 });
    },
  });
  try {
    const deadline = Date.now() + 10_000;
    while (calls === 0 && Date.now() < deadline) await new Promise((r) => setTimeout(r, 50));
    assert.equal(calls, 1);
    const until = Date.now() + 5_000;
    while (session.expiresAt < Date.now() / 1000 + 600 && Date.now() < until) {
      await new Promise((r) => setTimeout(r, 50));
    }
    assert.ok(session.expiresAt > Date.now() / 1000 + 600);
  } finally {
    await session.close();
  }
});

test("typed errors: forbidden workspace, bad path, and every wire code known", async () => {
  const session = await connect(hub.url, hub.token("alice", { workspaces: ["mine"] }));
  try {
    await assert.rejects(session.workspace("theirs").postMessage("x"), (e) => {
      assert.ok(e instanceof Forbidden);
      assert.equal(e.details.workspace, "theirs");
      return true;
    });
    await assert.rejects(session.workspace("mine").writeFile("../x", "t"), (e) => {
      assert.ok(e instanceof BadRequest);
      assert.match(String(e.details.field), /path/);
      return true;
    });
    assert.ok(ERROR_CODES.includes("conflict") && ERROR_CODES.includes("rateLimited"));
  } finally {
    await session.close();
  }
});

test("close ends iterating subscribers cleanly; calls after it are SessionClosed", async () => {
  const session = await connect(hub.url, hub.token("alice"));
  const ws = session.workspace(name());
  await ws.postMessage("one");
  const sub = ws.subscribe(0);
  const seen = [];
  const reading = (async () => {
    for await (const ev of sub) seen.push(ev.kind);
    return "ended";
  })();
  const until = Date.now() + 5000;
  while (!seen.includes("messagePosted") && Date.now() < until) {
    await new Promise((r) => setTimeout(r, 10));
  }
  await session.close();
  assert.equal(await reading, "ended");
  await assert.rejects(ws.postMessage("two"), (e) => e.name === "SessionClosed");
});

/** A loopback URL where nothing listens (a port just released). */
async function deadUrl() {
  const server = createServer();
  await new Promise((resolve) => server.listen(0, "127.0.0.1", resolve));
  const { port } = server.address();
  await new Promise((resolve) => server.close(resolve));
  return `ws://127.0.0.1:${port}`;
}

test("several nodes: the session opens on the first that answers", async () => {
  const urls = [await deadUrl(), hub.url];
  const session = await connect(urls, hub.token("alice"));
  try {
    assert.deepEqual(session.urls, urls);
    assert.equal(session.url, hub.url);
    assert.equal(session.agent, "alice");
    assert.equal((await session.workspace(name()).postMessage("via the second")).seq, 1);
  } finally {
    await session.close();
  }
});

test("several nodes: none answering is Unavailable; a bad token is refused at once", async () => {
  await assert.rejects(
    connect([await deadUrl(), await deadUrl()], hub.token("alice"), { openTimeout: 2 }),
    (e) => e instanceof Unavailable,
  );
  // The first node refuses the token: every node would, so the second is not tried.
  await assert.rejects(connect([hub.url, await deadUrl()], "not-a-jwt"), (e) => {
    assert.ok(e instanceof Unauthorized);
    return true;
  });
});

test("several nodes: an empty list, an empty URL or one that does not parse is BadRequest", async () => {
  for (const urls of [[], [""], [hub.url, ""], [hub.url, "not a url"]]) {
    await assert.rejects(connect(urls, hub.token("alice")), (e) => {
      assert.ok(e instanceof BadRequest);
      assert.equal(e.details.field, "url");
      return true;
    });
  }
});
