// Views derived from the workspace state: the file tree, the work-items board, the A2A task
// view of work items and executions (docs/a2a.md, "Mapping"), and line diffs.

import { diffLines } from "diff";
import type { ExecSummary, WorkItem } from "./protocol";

export interface TreeNode {
  name: string;
  path: string; // the file's path; for a directory its prefix
  children: TreeNode[] | null; // null: a file
}

/** The directory tree of `paths`, directories first, each level sorted by name. */
export function fileTree(paths: string[]): TreeNode[] {
  const root: TreeNode = { name: "", path: "", children: [] };
  for (const path of paths) {
    let node = root;
    const parts = path.split("/");
    parts.forEach((part, i) => {
      const isFile = i === parts.length - 1;
      const prefix = parts.slice(0, i + 1).join("/");
      let child = node.children!.find((c) => c.name === part && (c.children === null) === isFile);
      if (!child) {
        child = { name: part, path: prefix, children: isFile ? null : [] };
        node.children!.push(child);
      }
      node = child;
    });
  }
  const sort = (nodes: TreeNode[]): TreeNode[] => {
    nodes.sort((a, b) =>
      (a.children === null) !== (b.children === null)
        ? a.children === null
          ? 1
          : -1
        : a.name.localeCompare(b.name),
    );
    for (const n of nodes) if (n.children) sort(n.children);
    return nodes;
  };
  return sort(root.children!);
}

export const BOARD_COLUMNS = [
  "requested",
  "claimed",
  "inProgress",
  "feedbackRequested",
  "blocked",
  "published",
  "completed",
  "cancelled",
] as const;

/** Work items grouped by status, in board column order (unknown statuses last). */
export function board(items: Record<string, WorkItem>): [string, [string, WorkItem][]][] {
  const columns = new Map<string, [string, WorkItem][]>();
  for (const c of BOARD_COLUMNS) columns.set(c, []);
  for (const [id, item] of Object.entries(items).sort((a, b) => a[1].openedSeq - b[1].openedSeq)) {
    if (!columns.has(item.status)) columns.set(item.status, []);
    columns.get(item.status)!.push([id, item]);
  }
  return [...columns.entries()];
}

const ITEM_TASK_STATE: Record<string, string> = {
  requested: "SUBMITTED",
  claimed: "WORKING",
  inProgress: "WORKING",
  published: "WORKING",
  feedbackRequested: "INPUT_REQUIRED",
  blocked: "INPUT_REQUIRED",
  completed: "COMPLETED",
  cancelled: "CANCELED",
};
const EXEC_TASK_STATE: Record<string, string> = {
  requested: "SUBMITTED",
  running: "WORKING",
  completed: "COMPLETED",
  failed: "FAILED",
  cancelled: "CANCELED",
};

export interface A2ATask {
  taskId: string;
  type: "work item" | "execution";
  state: string;
  status: string;
}

/** The workspace's A2A tasks (contextId = the workspace): every work item (taskId = its
 * correlationId) and every execution (taskId = its execId), with the A2A TaskState. */
export function a2aTasks(
  items: Record<string, WorkItem>,
  executions: Record<string, ExecSummary>,
): A2ATask[] {
  return [
    ...Object.entries(items).map(([taskId, item]) => ({
      taskId,
      type: "work item" as const,
      state: ITEM_TASK_STATE[item.status] ?? "UNKNOWN",
      status: item.status,
    })),
    ...Object.entries(executions).map(([taskId, exec]) => ({
      taskId,
      type: "execution" as const,
      state: EXEC_TASK_STATE[exec.status] ?? "UNKNOWN",
      status: exec.status,
    })),
  ];
}

export interface DiffLine {
  op: "+" | "-" | " ";
  text: string;
}

/** A line diff of `before` → `after` (null: the file does not exist there). */
export function lineDiff(before: string | null, after: string | null): DiffLine[] {
  const out: DiffLine[] = [];
  for (const part of diffLines(before ?? "", after ?? "")) {
    const op = part.added ? "+" : part.removed ? "-" : " ";
    const lines = part.value.split("\n");
    if (lines[lines.length - 1] === "") lines.pop();
    for (const text of lines) out.push({ op, text });
  }
  return out;
}
