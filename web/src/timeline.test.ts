import { describe, expect, it } from "vitest";
import type { AgoraEvent } from "./protocol";
import { NO_FILTER, Timeline, summary, visibleRange } from "./timeline";

function ev(seq: number, kind: string, producer: string, extra: Partial<AgoraEvent> = {}): AgoraEvent {
  return { id: `e${seq}`, workspace: "w", seq, timestamp: 0, producer, kind, hash: "h", ...extra };
}

describe("Timeline", () => {
  it("keeps events in seq order and ignores repeats", () => {
    const t = new Timeline();
    t.append([ev(1, "messagePosted", "a"), ev(2, "messagePosted", "b")]);
    t.append([ev(2, "messagePosted", "b"), ev(3, "fileWritten", "a")]);
    expect(t.events.map((e) => e.seq)).toEqual([1, 2, 3]);
    expect(t.head).toBe(3);
    expect(t.first).toBe(1);
    expect(t.kinds.get("messagePosted")).toBe(2);
    expect(t.producers.get("a")).toBe(2);
  });

  it("filters by kind, producer, work item, execution and text", () => {
    const t = new Timeline();
    t.append([
      ev(1, "needWork", "alice", { correlationId: "task-1" }),
      ev(2, "workClaimed", "bob", { correlationId: "task-1" }),
      ev(3, "execRequested", "bob", { payload: { execId: "x1", source: "echo Hi" } }),
      ev(4, "messagePosted", "alice", { payload: { text: "Hello World" } }),
    ]);
    const seqs = () => Array.from({ length: t.size }, (_, i) => t.at(i)!.seq);
    t.setFilter({ ...NO_FILTER, producer: "bob" });
    expect(seqs()).toEqual([2, 3]);
    t.setFilter({ ...NO_FILTER, kinds: ["needWork", "messagePosted"] });
    expect(seqs()).toEqual([1, 4]);
    t.setFilter({ ...NO_FILTER, correlationId: "task-1" });
    expect(seqs()).toEqual([1, 2]);
    t.setFilter({ ...NO_FILTER, execId: "x1" });
    expect(seqs()).toEqual([3]);
    t.setFilter({ ...NO_FILTER, text: "  hello WORLD " });
    expect(seqs()).toEqual([4]);
    t.setFilter({ ...NO_FILTER, producer: "alice", text: "task-1" });
    expect(seqs()).toEqual([1]);
    t.setFilter(NO_FILTER);
    expect(t.size).toBe(4);
  });

  it("tells a work item's lifecycle up to a seq", () => {
    const t = new Timeline();
    t.append([
      ev(1, "needWork", "alice", { correlationId: "t1" }),
      ev(2, "messagePosted", "bob"),
      ev(3, "workClaimed", "bob", { correlationId: "t1" }),
      ev(4, "completed", "bob", { correlationId: "t1" }),
    ]);
    expect(t.lifecycle("t1", 3)).toEqual([
      { kind: "needWork", seq: 1, producer: "alice" },
      { kind: "workClaimed", seq: 3, producer: "bob" },
    ]);
    expect(t.lifecycle("t1", 4)).toHaveLength(3);
    expect(t.lifecycle("nope", 4)).toEqual([]);
  });

  it("applies the filter to live events without a re-scan", () => {
    const t = new Timeline();
    t.setFilter({ ...NO_FILTER, producer: "bob" });
    t.append([ev(1, "messagePosted", "alice"), ev(2, "messagePosted", "bob")]);
    t.append([ev(3, "messagePosted", "bob")]);
    expect(t.size).toBe(2);
    expect(t.at(1)!.seq).toBe(3);
    expect(t.executions.size).toBe(0);
  });

  it("finds the row of a seq in the filtered view", () => {
    const t = new Timeline();
    t.append([1, 2, 3, 4, 5, 6].map((s) => ev(s, "m", s % 2 ? "a" : "b")));
    t.setFilter({ ...NO_FILTER, producer: "b" }); // seqs 2, 4, 6
    expect(t.positionOf(1)).toBe(-1);
    expect(t.positionOf(4)).toBe(1);
    expect(t.positionOf(5)).toBe(1);
    expect(t.positionOf(100)).toBe(2);
  });

  it("scales to 100,000 events", () => {
    const t = new Timeline();
    const events = Array.from({ length: 100_000 }, (_, i) =>
      ev(i + 1, i % 10 === 0 ? "fileWritten" : "messagePosted", `agent-${i % 7}`, {
        payload: { text: `message ${i}` },
      }),
    );
    t.append(events);
    t.setFilter({ ...NO_FILTER, kinds: ["fileWritten"] });
    expect(t.size).toBe(10_000);
    t.setFilter({ ...NO_FILTER, text: "message 99999" });
    expect(t.size).toBe(1);
  });
});

describe("visibleRange", () => {
  it("renders the rows in view plus overscan, clamped", () => {
    expect(visibleRange(0, 240, 24, 1000, 5)).toEqual({ start: 0, end: 15 });
    expect(visibleRange(2400, 240, 24, 1000, 5)).toEqual({ start: 95, end: 115 });
    expect(visibleRange(24_000, 240, 24, 1000, 5)).toEqual({ start: 995, end: 1000 });
    expect(visibleRange(-50, 240, 24, 0, 5)).toEqual({ start: 0, end: 0 });
  });
});

describe("summary", () => {
  it("says what an event did", () => {
    expect(summary(ev(1, "fileWritten", "a", { payload: { path: "a.txt", size: 3 } }))).toBe(
      "a.txt (3 B)",
    );
    expect(summary(ev(1, "fileMoved", "a", { payload: { from: "a", to: "b" } }))).toBe("a → b");
    expect(
      summary(ev(1, "execFinished", "hub", { payload: { execId: "x", status: "completed", reason: "exit", exitCode: 0 } })),
    ).toBe("x completed (exit, exit 0)");
  });
});
