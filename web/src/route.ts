// The viewer's routes and deep links: /ui/ (sign in), /ui/workspaces, and
// /ui/w/<workspace>?seq=123&tab=state&file=src/a.py&exec=build-1&from=10 (the state at seq 123,
// a file, an execution, a diff from seq 10). Pure: parse and build only.

export type Tab = "state" | "diff" | "exec" | "tasks" | "verify";
export const TABS: Tab[] = ["state", "diff", "exec", "tasks", "verify"];

export type Route =
  | { page: "signin" }
  | { page: "workspaces" }
  | {
      page: "workspace";
      workspace: string;
      seq: number | null; // null: follow the head
      tab: Tab;
      file: string | null;
      exec: string | null;
      from: number | null; // the diff's older seq
    };

const BASE = "/ui";

function seqParam(value: string | null): number | null {
  if (value === null || !/^\d{1,15}$/.test(value)) return null;
  return Number(value);
}

export function parseRoute(pathname: string, search: string): Route {
  const path = pathname.startsWith(BASE) ? pathname.slice(BASE.length) : pathname;
  const params = new URLSearchParams(search);
  const match = /^\/w\/([^/]+)\/?$/.exec(path);
  if (match) {
    let workspace: string;
    try {
      workspace = decodeURIComponent(match[1]!);
    } catch {
      return { page: "workspaces" };
    }
    const tab = params.get("tab");
    return {
      page: "workspace",
      workspace,
      seq: seqParam(params.get("seq")),
      tab: TABS.includes(tab as Tab) ? (tab as Tab) : "state",
      file: params.get("file"),
      exec: params.get("exec"),
      from: seqParam(params.get("from")),
    };
  }
  if (path === "/workspaces" || path === "/workspaces/") return { page: "workspaces" };
  return { page: "signin" };
}

export function routeUrl(route: Route): string {
  if (route.page === "signin") return `${BASE}/`;
  if (route.page === "workspaces") return `${BASE}/workspaces`;
  const params = new URLSearchParams();
  if (route.seq !== null) params.set("seq", String(route.seq));
  if (route.tab !== "state") params.set("tab", route.tab);
  if (route.file) params.set("file", route.file);
  if (route.exec) params.set("exec", route.exec);
  if (route.from !== null) params.set("from", String(route.from));
  const query = params.toString();
  return `${BASE}/w/${encodeURIComponent(route.workspace)}${query ? `?${query}` : ""}`;
}

/** The WebSocket URL to offer at sign-in: the hub's own (from /ui/config.json), with an
 * unspecified bind address (0.0.0.0, ::) replaced by the host the page was loaded from, since
 * a browser cannot connect to those; without a configured URL, port 8765 on that host. */
export function resolveWsUrl(configured: string | null, pageHost: string): string {
  if (!configured) return `ws://${pageHost}:8765`;
  try {
    const url = new URL(configured);
    if (url.hostname === "0.0.0.0" || url.hostname === "[::]") url.hostname = pageHost;
    return url.toString().replace(/\/$/, "");
  } catch {
    return configured;
  }
}
