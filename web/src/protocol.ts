// The viewer's agora.v1 client (docs/protocol.md): hello, subscribe, state, getExec,
// checkpoint. Everything the viewer says to the hub goes through this one module so it can be
// swapped for clients/typescript later. It only reads: the viewer never publishes.

export type Json = null | boolean | number | string | Json[] | { [key: string]: Json };
export type Frame = { op: string; rid?: number | string; [key: string]: unknown };

/** A stored event as the hub sends it (events.md, "The envelope"). */
export interface AgoraEvent {
  id: string;
  workspace: string;
  seq: number;
  position?: number;
  timestamp: number;
  producer: string;
  kind: string;
  consumer?: string;
  topic?: string;
  correlationId?: string;
  causationId?: string;
  payload?: { [key: string]: Json };
  prev?: string;
  hash: string;
}

export interface Welcome {
  agent: string;
  rights: string[];
  server: string;
  workspaces: string[];
  backends: string[];
  expiresAt: number;
}

export class AgoraError extends Error {
  constructor(
    readonly code: string,
    message: string,
    readonly details: Record<string, unknown> = {},
  ) {
    super(message);
  }
}

/** The part of the browser's WebSocket the client uses (tests give a fake). */
export interface SocketLike {
  readyState: number;
  send(data: string): void;
  close(code?: number, reason?: string): void;
  onopen: ((ev: unknown) => void) | null;
  onmessage: ((ev: { data: unknown }) => void) | null;
  onclose: ((ev: { code: number; reason: string }) => void) | null;
  onerror: ((ev: unknown) => void) | null;
}
export type SocketFactory = (url: string, protocols: string[]) => SocketLike;

type Pending = {
  resolve: (frame: Frame) => void;
  reject: (error: Error) => void;
  stream?: (frame: Frame) => boolean; // true: the stream has ended
};

const browserSocket: SocketFactory = (url, protocols) =>
  new WebSocket(url, protocols) as unknown as SocketLike;

/** One authenticated connection. Replies are matched by rid; `event` frames go to the
 * subscription's handler. Closed connections reject every pending request. */
export class Connection {
  private nextRid = 1;
  private pending = new Map<number, Pending>();
  private subscriptions = new Map<string, (event: AgoraEvent) => void>();
  private closedWith: AgoraError | null = null;
  onClose: ((code: number, reason: string) => void) | null = null;
  welcome: Welcome | null = null;

  private constructor(private socket: SocketLike) {
    socket.onmessage = (ev) => this.receive(ev.data);
    socket.onclose = (ev) => this.closed(ev.code, ev.reason);
  }

  /** Connect to `url` and authenticate with `token` (a `hello` frame). Rejects with
   * AgoraError(`unauthorized`, …) for a refused token, `unavailable` if unreachable. */
  static async open(
    url: string,
    token: string,
    factory: SocketFactory = browserSocket,
  ): Promise<Connection> {
    const socket = factory(url, ["agora.v1"]);
    await new Promise<void>((resolve, reject) => {
      socket.onopen = () => resolve();
      socket.onerror = () => reject(new AgoraError("unavailable", `cannot connect to ${url}`));
      socket.onclose = (ev) =>
        reject(new AgoraError("unavailable", `closed ${ev.code} ${ev.reason}`));
    });
    const conn = new Connection(socket);
    const welcome = await conn.request({ op: "hello", token });
    conn.welcome = welcome as unknown as Welcome;
    return conn;
  }

  close(): void {
    this.socket.close(1000, "viewer closed");
  }

  get isOpen(): boolean {
    return this.closedWith === null;
  }

  request(frame: Frame, stream?: (frame: Frame) => boolean): Promise<Frame> {
    if (this.closedWith) return Promise.reject(this.closedWith);
    const rid = this.nextRid++;
    return new Promise((resolve, reject) => {
      this.pending.set(rid, { resolve, reject, stream });
      this.socket.send(JSON.stringify({ ...frame, rid }));
    });
  }

  /** Follow `workspace` from `afterSeq` (0: the whole log); `onEvent` gets each event in seq
   * order, catch-up then live. Resolves with the head when the subscription started. */
  async subscribe(
    workspace: string,
    afterSeq: number,
    onEvent: (event: AgoraEvent) => void,
  ): Promise<number> {
    this.subscriptions.set(workspace, onEvent);
    try {
      const reply = await this.request({ op: "subscribe", workspace, afterSeq });
      return reply.head as number;
    } catch (e) {
      this.subscriptions.delete(workspace);
      throw e;
    }
  }

  async unsubscribe(workspace: string): Promise<void> {
    this.subscriptions.delete(workspace);
    await this.request({ op: "unsubscribe", workspace });
  }

  /** The workspace state (metadata) at `atSeq` (now when omitted); with `paths`, those files
   * with their content. */
  async state(
    workspace: string,
    options: { atSeq?: number; paths?: string[] } = {},
  ): Promise<{ seq: number; state: WorkspaceState }> {
    const frame: Frame = { op: "state", workspace };
    if (options.atSeq !== undefined) frame.atSeq = options.atSeq;
    if (options.paths) {
      frame.contents = true;
      frame.paths = options.paths;
    }
    const reply = await this.request(frame);
    return { seq: reply.seq as number, state: reply.state as WorkspaceState };
  }

  /** A file's content at `atSeq`, or null when it does not exist then. */
  async fileAt(workspace: string, path: string, atSeq?: number): Promise<FileEntry | null> {
    const { state } = await this.state(workspace, { atSeq, paths: [path] });
    return state.files?.[path] ?? null;
  }

  /** Stream an execution's events (`getExec`, resume full): `onEvent` gets each, then the
   * promise resolves with the final status. */
  async getExec(
    workspace: string,
    execId: string,
    onEvent: (event: AgoraEvent, text: string | undefined) => void,
  ): Promise<string> {
    const end = await this.request({ op: "getExec", workspace, execId, resume: "full" }, (f) => {
      if (f.op === "execEvent") {
        onEvent(f.event as AgoraEvent, f.text as string | undefined);
        return false;
      }
      return true;
    });
    return end.status as string;
  }

  async checkpoint(workspace: string): Promise<{ size: number; note: string }> {
    const reply = await this.request({ op: "checkpoint", workspace });
    return { size: reply.size as number, note: reply.note as string };
  }

  private receive(data: unknown): void {
    if (typeof data !== "string") return;
    let frame: Frame;
    try {
      frame = JSON.parse(data) as Frame;
    } catch {
      return; // the hub only sends JSON; ignore anything else
    }
    if (frame.op === "event") {
      const ws = frame.workspace as string;
      this.subscriptions.get(ws)?.(frame.event as AgoraEvent);
      return;
    }
    const rid = typeof frame.rid === "number" ? frame.rid : undefined;
    if (rid === undefined) {
      if (frame.op === "error") {
        // An error without rid ends the connection (token expired or revoked).
        this.closedWith = new AgoraError(
          String(frame.code),
          String(frame.message),
          (frame.details as Record<string, unknown>) ?? {},
        );
      }
      return;
    }
    const pending = this.pending.get(rid);
    if (!pending) return;
    if (frame.op === "error") {
      this.pending.delete(rid);
      pending.reject(
        new AgoraError(
          String(frame.code),
          String(frame.message),
          (frame.details as Record<string, unknown>) ?? {},
        ),
      );
      return;
    }
    if (pending.stream && !pending.stream(frame)) return;
    this.pending.delete(rid);
    pending.resolve(frame);
  }

  private closed(code: number, reason: string): void {
    const error =
      this.closedWith ?? new AgoraError("unavailable", `connection closed (${code} ${reason})`);
    this.closedWith = error;
    for (const p of this.pending.values()) p.reject(error);
    this.pending.clear();
    this.onClose?.(code, reason);
  }
}

// -- the state reply (schemas/workspace-state.json) -------------------------------------------

export interface FileEntry {
  rev: number;
  sha256: string;
  size: number;
  producer: string;
  seq: number;
  mediaType?: string;
  blob?: string;
  text?: string;
  base64?: string;
}
export interface WorkItem {
  status: string;
  owner?: string;
  requester?: string;
  consumer?: string;
  topic?: string;
  openedSeq: number;
  updatedSeq: number;
  lastKind: string;
  lastProducer: string;
}
export interface ExecSummary {
  backend: string;
  status: string;
  requestedBy?: string;
  exitCode?: number;
  reason?: string;
  disposed?: boolean;
}
export interface Member {
  present: boolean;
  via?: string;
  joinedSeq?: number;
  cardUrl?: string;
}
export interface ArtifactEntry {
  blob: string;
  sha256: string;
  sizeBytes: number;
  mediaType?: string;
  producer: string;
  seq: number;
  execId?: string;
}
export interface WorkspaceState {
  workspace: string;
  seq: number;
  files?: Record<string, FileEntry>;
  workItems?: Record<string, WorkItem>;
  executions?: Record<string, ExecSummary>;
  members?: Record<string, Member>;
  artifacts?: Record<string, ArtifactEntry>;
  messages?: number;
}

/** The text of a file entry (base64 decoded as UTF-8), or null for blob content. */
export function fileText(entry: FileEntry | null): string | null {
  if (!entry) return null;
  if (entry.text !== undefined) return entry.text;
  if (entry.base64 !== undefined) {
    const bytes = Uint8Array.from(atob(entry.base64), (c) => c.charCodeAt(0));
    return new TextDecoder().decode(bytes);
  }
  return null;
}

// -- read-only HTTP endpoints of the viewer (hub/viewer/app.py) -------------------------------

export interface WorkspaceRow {
  workspace: string;
  head: number;
  lastActivity: number;
}

export interface ViewerConfig {
  wsUrl: string;
  version: string;
}

async function getJson<T>(path: string, token?: string): Promise<T> {
  const headers: Record<string, string> = token ? { Authorization: `Bearer ${token}` } : {};
  const response = await fetch(path, { headers });
  if (!response.ok) {
    let body: { code?: string; message?: string } = {};
    try {
      body = (await response.json()) as typeof body;
    } catch {
      /* not JSON */
    }
    throw new AgoraError(body.code ?? `http${response.status}`, body.message ?? response.statusText);
  }
  return (await response.json()) as T;
}

export const api = {
  config: () => getJson<ViewerConfig>("/ui/config.json"),
  workspaces: (token: string) => getJson<WorkspaceRow[]>("/ui/api/workspaces", token),
  verify: (token: string, workspace: string) =>
    getJson<{ ok: boolean; checked: number; head: number; error?: Record<string, Json> }>(
      `/ui/api/w/${encodeURIComponent(workspace)}/verify`,
      token,
    ),
  /** The stored log up to the head, read as JSON Lines over HTTP and handed over a chunk at a
   * time: the fast catch-up (one response instead of one WebSocket message per event, which
   * costs Chromium about 70 µs each). Resolves with the last seq read; the caller then
   * subscribes after it. */
  async catchUp(
    token: string,
    workspace: string,
    onEvents: (events: AgoraEvent[]) => void,
    tail?: number,
  ): Promise<number> {
    const query = tail === undefined ? "" : `?tail=${tail}`;
    const response = await fetch(`/ui/api/w/${encodeURIComponent(workspace)}/export${query}`, {
      headers: { Authorization: `Bearer ${token}` },
    });
    if (!response.ok || !response.body) {
      let body: { code?: string; message?: string } = {};
      try {
        body = (await response.json()) as typeof body;
      } catch {
        /* not JSON */
      }
      throw new AgoraError(body.code ?? `http${response.status}`, body.message ?? "");
    }
    const reader = response.body.getReader();
    const decoder = new TextDecoder();
    let rest = "";
    let last = 0;
    for (;;) {
      const { done, value } = await reader.read();
      rest += decoder.decode(value, { stream: !done });
      const cut = done ? rest.length : rest.lastIndexOf("\n") + 1;
      const lines = rest.slice(0, cut).split("\n");
      rest = rest.slice(cut);
      const events: AgoraEvent[] = [];
      for (const line of lines) if (line) events.push(JSON.parse(line) as AgoraEvent);
      if (events.length > 0) {
        last = events[events.length - 1]!.seq;
        onEvents(events);
      }
      if (done) return last;
    }
  },
  async export(token: string, workspace: string): Promise<Blob> {
    const response = await fetch(`/ui/api/w/${encodeURIComponent(workspace)}/export`, {
      headers: { Authorization: `Bearer ${token}` },
    });
    if (!response.ok) throw new AgoraError(`http${response.status}`, response.statusText);
    return await response.blob();
  },
};
