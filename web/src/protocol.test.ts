import { describe, expect, it } from "vitest";
import { AgoraError, Connection, api, fileText, type SocketLike } from "./protocol";

class FakeSocket implements SocketLike {
  readyState = 1;
  sent: Record<string, unknown>[] = [];
  onopen: ((ev: unknown) => void) | null = null;
  onmessage: ((ev: { data: unknown }) => void) | null = null;
  onclose: ((ev: { code: number; reason: string }) => void) | null = null;
  onerror: ((ev: unknown) => void) | null = null;
  constructor(private script: (frame: Record<string, unknown>, socket: FakeSocket) => void) {
    queueMicrotask(() => this.onopen?.({}));
  }
  send(data: string) {
    const frame = JSON.parse(data) as Record<string, unknown>;
    this.sent.push(frame);
    queueMicrotask(() => this.script(frame, this));
  }
  push(frame: unknown) {
    this.onmessage?.({ data: JSON.stringify(frame) });
  }
  close(code = 1000, reason = "") {
    this.onclose?.({ code, reason });
  }
}

const hub = (frame: Record<string, unknown>, s: FakeSocket) => {
  const rid = frame.rid;
  switch (frame.op) {
    case "hello":
      if (frame.token === "bad") {
        s.push({ op: "error", rid, code: "unauthorized", message: "bad token", details: { reason: "malformed" } });
        s.close(4401, "unauthorized: malformed");
      } else s.push({ op: "welcome", rid, agent: "alice", rights: ["read"], server: "agora", workspaces: ["*"], backends: [], expiresAt: 1 });
      return;
    case "subscribe":
      s.push({ op: "subscribed", rid, workspace: frame.workspace, head: 2 });
      s.push({ op: "event", workspace: frame.workspace, event: { seq: 1, kind: "a" } });
      s.push({ op: "event", workspace: "other", event: { seq: 9, kind: "x" } });
      s.push({ op: "event", workspace: frame.workspace, event: { seq: 2, kind: "b" } });
      return;
    case "state":
      s.push({ op: "state", rid, workspace: frame.workspace, seq: 5, state: { workspace: "w", seq: 5, files: { "a.txt": { rev: 1, text: "hi" } } } });
      return;
    case "getExec":
      s.push({ op: "execEvent", rid, event: { seq: 3, kind: "execOutput" }, text: "out" });
      s.push({ op: "execEnd", rid, status: "completed" });
      return;
    default:
      s.push({ op: "error", rid, code: "forbidden", message: "no", details: { right: "read" } });
  }
};

describe("Connection", () => {
  it("says hello and keeps the welcome", async () => {
    const c = await Connection.open("ws://x", "good", () => new FakeSocket(hub));
    expect(c.welcome?.agent).toBe("alice");
  });

  it("rejects a refused token with its code", async () => {
    await expect(Connection.open("ws://x", "bad", () => new FakeSocket(hub))).rejects.toMatchObject({
      code: "unauthorized",
    });
  });

  it("routes events to their subscription and matches replies by rid", async () => {
    let socket: FakeSocket | null = null;
    const c = await Connection.open("ws://x", "good", () => (socket = new FakeSocket(hub)));
    const seen: number[] = [];
    const head = await c.subscribe("w", 0, (e) => seen.push(e.seq));
    expect(head).toBe(2);
    await new Promise((r) => setTimeout(r, 0));
    expect(seen).toEqual([1, 2]);
    const file = await c.fileAt("w", "a.txt", 4);
    expect(fileText(file)).toBe("hi");
    expect(socket!.sent.at(-1)).toMatchObject({ op: "state", atSeq: 4, contents: true, paths: ["a.txt"] });
    const chunks: string[] = [];
    expect(await c.getExec("w", "x", (_, text) => chunks.push(text ?? ""))).toBe("completed");
    expect(chunks).toEqual(["out"]);
    await expect(c.checkpoint("w")).rejects.toBeInstanceOf(AgoraError);
  });

  it("rejects what is pending when the connection closes", async () => {
    let socket: FakeSocket | null = null;
    const helloOnly = (f: Record<string, unknown>, s: FakeSocket) => f.op === "hello" && hub(f, s);
    const c = await Connection.open("ws://x", "good", () => (socket = new FakeSocket(helloOnly)));
    const pending = c.state("w");
    socket!.close(1001, "going away");
    await expect(pending).rejects.toMatchObject({ code: "unavailable" });
    await expect(c.state("w")).rejects.toMatchObject({ code: "unavailable" });
  });

  it("decodes base64 file content as UTF-8", () => {
    expect(fileText({ rev: 1, sha256: "", size: 2, producer: "a", seq: 1, base64: "w6k=" })).toBe("é");
    expect(fileText(null)).toBeNull();
  });
});

describe("api.catchUp", () => {
  it("reads JSON Lines split anywhere across chunks", async () => {
    const text = [1, 2, 3].map((seq) => JSON.stringify({ seq, kind: "m", payload: { t: "é\n" } })).join("\n") + "\n";
    const bytes = new TextEncoder().encode(text);
    const cuts = [0, 5, 31, 32, bytes.length - 1, bytes.length];
    const chunks = cuts.slice(1).map((end, i) => bytes.slice(cuts[i], end));
    const body = new ReadableStream<Uint8Array>({
      start(controller) {
        for (const c of chunks) controller.enqueue(c);
        controller.close();
      },
    });
    const seen: number[] = [];
    const original = globalThis.fetch;
    const urls: string[] = [];
    globalThis.fetch = (async (url: string) => {
      urls.push(url);
      return new Response(body, { status: 200 });
    }) as typeof fetch;
    try {
      const last = await api.catchUp("t", "w", (events) => seen.push(...events.map((e) => e.seq)), 5);
      expect(urls).toEqual(["/ui/api/w/w/export?tail=5"]);
      expect(last).toBe(3);
      expect(seen).toEqual([1, 2, 3]);
      globalThis.fetch = (async () =>
        new Response(JSON.stringify({ code: "forbidden", message: "no" }), { status: 403 })) as typeof fetch;
      await expect(api.catchUp("t", "w", () => undefined)).rejects.toMatchObject({ code: "forbidden" });
    } finally {
      globalThis.fetch = original;
    }
  });
});
