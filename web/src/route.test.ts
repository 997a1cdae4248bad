import { describe, expect, it } from "vitest";
import { parseRoute, resolveWsUrl, routeUrl } from "./route";

describe("routes", () => {
  it("parses a deep link to the state at a seq", () => {
    expect(parseRoute("/ui/w/demo", "?seq=123")).toEqual({
      page: "workspace",
      workspace: "demo",
      seq: 123,
      tab: "state",
      file: null,
      exec: null,
      from: null,
    });
  });

  it("round-trips every field", () => {
    const route = {
      page: "workspace" as const,
      workspace: "a.b-c_d",
      seq: 7,
      tab: "diff" as const,
      file: "src/a b.py",
      exec: "build-1",
      from: 3,
    };
    const url = new URL(routeUrl(route), "http://x");
    expect(parseRoute(url.pathname, url.search)).toEqual(route);
  });

  it("refuses nonsense quietly", () => {
    const r = parseRoute("/ui/w/demo", "?seq=-1&tab=evil&from=1e9");
    expect(r).toMatchObject({ seq: null, tab: "state", from: null });
    expect(parseRoute("/ui/w/%E0%A4%A", "")).toEqual({ page: "workspaces" });
    expect(parseRoute("/ui/", "")).toEqual({ page: "signin" });
    expect(parseRoute("/ui/workspaces", "")).toEqual({ page: "workspaces" });
    expect(routeUrl({ page: "workspace", workspace: "w", seq: null, tab: "state", file: null, exec: null, from: null })).toBe("/ui/w/w");
  });
});

describe("resolveWsUrl", () => {
  it("keeps a real address and replaces an unspecified one by the page's host", () => {
    expect(resolveWsUrl("ws://127.0.0.1:8765", "example.org")).toBe("ws://127.0.0.1:8765");
    expect(resolveWsUrl("ws://0.0.0.0:9000", "hub.example")).toBe("ws://hub.example:9000");
    expect(resolveWsUrl("ws://[::]:9000", "hub.example")).toBe("ws://hub.example:9000");
    expect(resolveWsUrl(null, "h")).toBe("ws://h:8765");
    expect(resolveWsUrl("not a url", "h")).toBe("not a url");
  });
});
