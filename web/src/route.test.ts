import { describe, expect, it } from "vitest";
import { parseRoute, routeUrl } from "./route";

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
