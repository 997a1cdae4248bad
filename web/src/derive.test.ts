import { describe, expect, it } from "vitest";
import { a2aTasks, board, fileTree, lineDiff } from "./derive";
import type { WorkItem } from "./protocol";

const item = (status: string, openedSeq: number): WorkItem => ({
  status,
  openedSeq,
  updatedSeq: openedSeq,
  lastKind: "needWork",
  lastProducer: "a",
});

describe("derived views", () => {
  it("builds a file tree, directories first", () => {
    const tree = fileTree(["b.txt", "src/z.py", "src/a.py", "a/x"]);
    expect(tree.map((n) => n.name)).toEqual(["a", "src", "b.txt"]);
    expect(tree[1]!.children!.map((n) => n.path)).toEqual(["src/a.py", "src/z.py"]);
    expect(tree[2]!.children).toBeNull();
  });

  it("groups work items by status in board order", () => {
    const cols = board({ t2: item("completed", 5), t1: item("requested", 1), t3: item("weird", 2) });
    const nonEmpty = cols.filter(([, items]) => items.length).map(([s, items]) => [s, items.map(([id]) => id)]);
    expect(nonEmpty).toEqual([
      ["requested", ["t1"]],
      ["completed", ["t2"]],
      ["weird", ["t3"]],
    ]);
  });

  it("maps work items and executions to A2A task states", () => {
    const tasks = a2aTasks(
      { t1: item("feedbackRequested", 1) },
      { x1: { backend: "process", status: "failed" } },
    );
    expect(tasks).toEqual([
      { taskId: "t1", type: "work item", state: "INPUT_REQUIRED", status: "feedbackRequested" },
      { taskId: "x1", type: "execution", state: "FAILED", status: "failed" },
    ]);
  });

  it("diffs lines, a missing file as empty", () => {
    expect(lineDiff("a\nb\nc\n", "a\nB\nc\n")).toEqual([
      { op: " ", text: "a" },
      { op: "-", text: "b" },
      { op: "+", text: "B" },
      { op: " ", text: "c" },
    ]);
    expect(lineDiff(null, "new\n")).toEqual([{ op: "+", text: "new" }]);
  });
});
