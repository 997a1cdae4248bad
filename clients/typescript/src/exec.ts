/**
 * Executions through a session: `ws.runtime` (docs/execution.md, "Runtime";
 * hub/client/exec.py). {@link Runtime.exec} starts one (`exec`, never sent twice); an
 * {@link ExecHandle} streams its events (`getExec`, resumed after a reconnect from the last
 * output it got), waits for its result, kills or disposes it.
 */

import { type AgoraError, BadRequest, Internal, Unavailable } from "./errors.js";
import type { AgoraEvent } from "./feed.js";
import type { Exec, PolicyPatch, RuntimeResult } from "./generated/protocol.js";
import type { Frame, Handler, Session } from "./session.js";
import { base64ToBytes, type Workspace } from "./workspace.js";

/** One event of an execution's stream and, for an `execOutput` of a `utf8` execution, its
 * bytes decoded as `text`. */
export interface ExecUpdate {
  event: AgoraEvent;
  text: string | null;
}

/** The outcome of an execution; `stdout`/`stderr` are strings for `encoding: "utf8"`, else
 * bytes. */
export interface ExecOutcome {
  status: RuntimeResult["status"];
  reason: string;
  exitCode: number;
  stdout: string | Uint8Array;
  stderr: string | Uint8Array;
  value: unknown;
  hasValue: boolean;
  stdoutTruncated: boolean;
  stderrTruncated: boolean;
  durationMs: number;
  pushed: number;
  pulled: number;
  skipped: RuntimeResult["skipped"];
  diagnostics: unknown[];
}

export interface ExecOptions {
  backend?: string;
  /** The execution id (default: a UUID). */
  id?: string;
  /** WASM bytes, or the sha256 of a blob. */
  module?: Uint8Array | string;
  language?: string;
  argv?: string[];
  stdin?: Uint8Array | string;
  input?: unknown;
  env?: Record<string, string>;
  cwd?: string;
  timeoutMs?: number;
  encoding?: "utf8" | "base64";
  policy?: PolicyPatch;
}

function outcome(result: RuntimeResult): ExecOutcome {
  const out = (text: string): string | Uint8Array =>
    result.encoding === "utf8" ? text : base64ToBytes(text);
  const hasValue = Object.prototype.hasOwnProperty.call(result, "value");
  return {
    status: result.status,
    reason: result.reason,
    exitCode: result.exitCode,
    stdout: out(result.stdout),
    stderr: out(result.stderr),
    value: hasValue ? result.value : null,
    hasValue,
    stdoutTruncated: result.stdoutTruncated,
    stderrTruncated: result.stderrTruncated,
    durationMs: result.durationMs,
    pushed: result.pushed,
    pulled: result.pulled,
    skipped: result.skipped ?? [],
    diagnostics: result.diagnostics ?? [],
  };
}

function bytesToBase64(bytes: Uint8Array): string {
  let binary = "";
  for (let i = 0; i < bytes.length; i += 0x8000) {
    binary += String.fromCharCode(...bytes.subarray(i, i + 0x8000));
  }
  return btoa(binary);
}

/** One `exec`: sent once, never again after a reconnect (the hub may have started it). */
class ExecCall implements Handler {
  sent = false;
  constructor(
    readonly execId: string,
    readonly data: string,
    readonly resolve: (frame: Frame) => void,
    readonly reject: (error: AgoraError) => void,
  ) {}
  onReply(frame: Frame): void {
    this.resolve(frame);
  }
  onRefused(error: AgoraError): void {
    this.reject(error);
  }
  onAttach(): string | null {
    if (!this.sent) {
      this.sent = true;
      return this.data;
    }
    this.reject(
      new Unavailable(
        `the connection dropped before the hub answered exec ${JSON.stringify(this.execId)}; ` +
          "it may have started: ws.runtime.getExec(id) tells",
        { execId: this.execId },
      ),
    );
    return null;
  }
  onDetach(): boolean {
    return true; // kept: onAttach fails it on the next connection (it may have started)
  }
  fail(error: AgoraError): void {
    this.reject(error);
  }
}

type Item = ExecUpdate | AgoraError | null;

/** One `getExec` stream; after a reconnect it asks again from the last output it got and
 * drops what it already delivered (any later seq is the next one: an execution's events are
 * scattered over the workspace's seqs). */
class ExecFollow implements Handler {
  last = 0;
  lastN: number | null = null;
  items: Item[] = [];
  #wake: (() => void) | null = null;

  constructor(
    readonly session: Session,
    readonly rid: number,
    readonly workspace: string,
    readonly execId: string,
    readonly resume: "full" | "tail" | number,
  ) {}

  frame(): string {
    let resume = this.resume;
    if (this.last) resume = this.lastN ?? "full";
    return JSON.stringify({
      op: "getExec",
      rid: this.rid,
      workspace: this.workspace,
      execId: this.execId,
      resume,
    });
  }

  #push(item: Item): void {
    this.items.push(item);
    const wake = this.#wake;
    this.#wake = null;
    wake?.();
  }

  onReply(frame: Frame): void {
    if (frame.op === "execEvent") {
      const ev = frame.event as AgoraEvent | undefined;
      if (ev === undefined || typeof ev.seq !== "number" || ev.seq <= this.last) return;
      this.last = ev.seq;
      if (ev.kind === "execOutput" && typeof ev.payload?.n === "number") this.lastN = ev.payload.n;
      this.#push({ event: ev, text: typeof frame.text === "string" ? frame.text : null });
    } else if (frame.op === "execEnd") {
      this.session.forget(this.rid);
      this.#push(null);
    }
  }
  onRefused(error: AgoraError): void {
    this.session.forget(this.rid);
    this.#push(error);
  }
  onAttach(): string {
    return this.frame();
  }
  onDetach(): boolean {
    return true;
  }
  fail(error: AgoraError): void {
    this.#push(error);
  }

  async *updates(): AsyncGenerator<ExecUpdate, void, undefined> {
    try {
      for (;;) {
        while (this.items.length === 0) {
          await new Promise<void>((resolve) => {
            this.#wake = resolve;
          });
        }
        const item = this.items.shift() ?? null;
        if (item === null) return;
        if (!("event" in item)) throw item;
        yield item;
      }
    } finally {
      this.session.forget(this.rid);
    }
  }
}

/** One execution: `id`, its event stream (`for await (const u of handle.events())`),
 * `result()`, `kill()`. Single consumer: read the stream *or* wait for `result()`. */
export class ExecHandle {
  #consumer: string | null = null;
  #streaming = false;
  #result: Promise<ExecOutcome> | null = null;

  constructor(
    readonly runtime: Runtime,
    readonly id: string,
    readonly resume: "full" | "tail" | number = "full",
  ) {}

  /** The execution's events (from `execRequested` for a new one), live until
   * `execFinished`. Rejects with `BadRequest` (a second consumer), `NotFound`, `Busy`. */
  async *events(): AsyncGenerator<ExecUpdate, void, undefined> {
    if (this.#consumer !== null) {
      throw new BadRequest(`execution ${this.id} is already consumed by ${this.#consumer}`);
    }
    this.#consumer = "the event stream";
    const session = this.runtime.workspace.session;
    session.checkUsable();
    const rid = session.nextRid();
    const follow = new ExecFollow(session, rid, this.runtime.workspace.name, this.id, this.resume);
    session.expect(rid, follow, false);
    session.send(follow.frame());
    this.#streaming = true;
    try {
      yield* follow.updates();
    } finally {
      this.#streaming = false;
    }
  }

  [Symbol.asyncIterator](): AsyncGenerator<ExecUpdate, void, undefined> {
    return this.events();
  }

  /** Wait for the execution to finish; its result (memoised). */
  result(): Promise<ExecOutcome> {
    if (this.#streaming) {
      return Promise.reject(new BadRequest(`execution ${this.id} is being read as a stream`));
    }
    this.#consumer ??= "result()";
    this.#result ??= (async () => {
      const ws = this.runtime.workspace;
      const reply = await ws.session.request({
        op: "execResult",
        workspace: ws.name,
        execId: this.id,
      });
      if (reply.op !== "execResult") {
        throw new Internal(`unexpected reply to execResult: ${reply.op}`);
      }
      return outcome(reply.result as RuntimeResult);
    })();
    return this.#result;
  }

  /** Stop the execution; resolves once it is recorded as finished, with its final status. */
  async kill(): Promise<string> {
    const ws = this.runtime.workspace;
    const reply = await ws.session.request({ op: "kill", workspace: ws.name, execId: this.id });
    if (reply.op !== "killed") throw new Internal(`unexpected reply to kill: ${reply.op}`);
    return String(reply.status);
  }
}

/** `ws.runtime`: run code in the workspace on the hub's backend instances. */
export class Runtime {
  constructor(readonly workspace: Workspace) {}

  /** Start an execution; resolves with its handle once the hub accepted it (`execRequested`
   * is in the log). Rejects with `Forbidden` (no `exec` right, backend not in the token),
   * `NotFound` (unknown backend), `BadRequest`, `Busy`, `Exists`, `Unavailable` (or the
   * connection dropped before the answer: not sent again, `getExec(id)` tells). */
  async exec(source: string | null, options: ExecOptions = {}): Promise<ExecHandle> {
    const session = this.workspace.session;
    session.checkUsable();
    const encoding = options.encoding ?? "utf8";
    if (encoding !== "utf8" && encoding !== "base64") {
      throw new BadRequest("encoding is 'utf8' or 'base64'", { field: "encoding" });
    }
    const execId = options.id ?? globalThis.crypto.randomUUID();
    const rid = session.nextRid();
    const frame: Exec & { rid: number } = {
      op: "exec",
      rid,
      workspace: this.workspace.name,
      execId,
      encoding,
    };
    if (source !== null) frame.source = source;
    if (options.backend !== undefined) frame.backend = options.backend;
    if (options.module !== undefined) {
      frame.module =
        typeof options.module === "string"
          ? { blob: options.module }
          : bytesToBase64(options.module);
    }
    if (options.language !== undefined) frame.language = options.language;
    if (options.argv !== undefined) frame.argv = [...options.argv];
    if (options.stdin !== undefined) {
      const bytes =
        typeof options.stdin === "string" ? new TextEncoder().encode(options.stdin) : options.stdin;
      frame.stdin = bytesToBase64(bytes);
    }
    if (options.input !== undefined) frame.input = options.input;
    if (options.env !== undefined) frame.env = { ...options.env };
    if (options.cwd !== undefined) frame.cwd = options.cwd;
    if (options.timeoutMs !== undefined) frame.timeoutMs = options.timeoutMs;
    if (options.policy !== undefined) frame.policy = options.policy;
    const reply = await new Promise<Frame>((resolve, reject) => {
      const call = new ExecCall(execId, JSON.stringify(frame), resolve, reject);
      session.expect(rid, call, true);
      if (session.connected) {
        call.sent = true;
        session.send(call.data);
      }
    }).finally(() => session.forget(rid));
    if (reply.op !== "execAccepted") throw new Internal(`unexpected reply to exec: ${reply.op}`);
    return new ExecHandle(this, String(reply.execId));
  }

  /** A handle on an existing execution; its stream starts per `resume`. */
  getExec(id: string, resume: "full" | "tail" | number = "full"): ExecHandle {
    return new ExecHandle(this, id, resume);
  }

  /** Free a finished execution's id and journal. Rejects with `NotFound`, `Busy`. */
  async disposeExec(id: string): Promise<void> {
    const ws = this.workspace;
    const reply = await ws.session.request({ op: "dispose", workspace: ws.name, execId: id });
    if (reply.op !== "disposed") throw new Internal(`unexpected reply to dispose: ${reply.op}`);
  }
}
