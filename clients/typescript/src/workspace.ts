/**
 * The workspace API of a session: publish, subscribe, state, files, adk-code's work-item
 * verbs and the waiters (hub/client/workspace.py).
 *
 * - **Waiters read the log first.** Every waiter subscribes with `afterSeq` (0, a seq the
 *   caller knows, or the seq that opened the work item) and scans history before following
 *   live events, so an event published just before the wait is never missed.
 * - **Retries are idempotent.** Publishes carry client-minted UUID ids; a publish in flight
 *   when a connection drops is sent again on the next one, and the hub answers a repeated id
 *   with the original seq and `duplicate: true`.
 */

import { Backoff, sleep } from "./backoff.js";
import {
  BadRequest,
  Internal,
  NotFound,
  RateLimited,
  SessionClosed,
  WaitTimeout,
} from "./errors.js";
import { Runtime } from "./exec.js";
import { type AgoraEvent, Subscription } from "./feed.js";
import type { StoredEvent } from "./generated/events.js";
import type { WorkspaceState } from "./generated/workspace-state.js";
import type { Frame, Session } from "./session.js";

export const RATE_LIMIT_RETRIES = 8;
export const MAX_RATE_LIMIT_WAIT = 5.0;
export const INDEX_SIZE = 4096;

/** A draft: an event without the fields the hub sets (`kind` required, `id` minted if absent). */
export type EventDraft = StoredEvent;

export interface PublishAck {
  workspace: string;
  seq: number;
  id: string;
  duplicate: boolean;
}

export interface BatchAck {
  workspace: string;
  seqs: number[];
  ids: string[];
  duplicate: boolean;
}

export interface StateOptions {
  atSeq?: number;
  /** Inline file content (bounded by the hub's `max_state_contents_bytes`). */
  contents?: boolean;
  /** Only these files. */
  paths?: string[];
}

export interface WaitOptions {
  /** Seconds; rejects with {@link WaitTimeout} (name `TimeoutError`) after it. */
  timeout?: number;
  afterSeq?: number;
  kinds?: string[];
  excludeSelf?: boolean;
}

/** Payload-less work-item fields of a verb. */
export interface WorkOptions {
  topic?: string;
  consumer?: string;
  causationId?: string;
}

const COLLABORATION_KINDS: ReadonlySet<string> = new Set([
  "needWork",
  "workClaimed",
  "workPublished",
  "feedbackRequested",
  "feedbackProvided",
  "blocked",
  "completed",
  "workCancelled",
]);
const TAKEN: ReadonlySet<string> = new Set(["workClaimed", "completed", "workCancelled"]);

function uuid(): string {
  return globalThis.crypto.randomUUID();
}

/** A new id for a published event: time-ordered (UUIDv7, RFC 9562), as the hub mints its
 * own, so the hub's id index grows at its end (random ids cost the hub up to a fifth of its
 * ingest; docs/operations.md "Ids"). 48 bits of milliseconds, then 74 random bits. */
function eventId(now: number = Date.now()): string {
  const bytes = new Uint8Array(16);
  globalThis.crypto.getRandomValues(bytes);
  let ms = Math.floor(now);
  for (let i = 5; i >= 0; i -= 1) {
    bytes[i] = ms % 256;
    ms = Math.floor(ms / 256);
  }
  bytes[6] = 0x70 | (bytes[6]! & 0x0f); // version 7
  bytes[8] = 0x80 | (bytes[8]! & 0x3f); // variant 0b10
  const hex = Array.from(bytes, (b) => b.toString(16).padStart(2, "0")).join("");
  return `${hex.slice(0, 8)}-${hex.slice(8, 12)}-${hex.slice(12, 16)}-${hex.slice(16, 20)}-${hex.slice(20)}`;
}

function bytesToBase64(bytes: Uint8Array): string {
  let binary = "";
  for (let i = 0; i < bytes.length; i += 0x8000) {
    binary += String.fromCharCode(...bytes.subarray(i, i + 0x8000));
  }
  return btoa(binary);
}

export function base64ToBytes(text: string): Uint8Array {
  const binary = atob(text);
  const out = new Uint8Array(binary.length);
  for (let i = 0; i < binary.length; i += 1) out[i] = binary.charCodeAt(i);
  return out;
}

/** One workspace through a session. Every call rejects with what ended the session
 * (`Unauthorized`, `Unavailable`, `SessionClosed`) besides the errors it lists. */
export class Workspace {
  /** Executions in this workspace (docs/execution.md, "Runtime"). */
  readonly runtime: Runtime;
  // correlationId -> [topic, seq of the item's first event or 0 if unknown]; bounded.
  #items = new Map<string, [string | null, number]>();

  constructor(
    readonly session: Session,
    readonly name: string,
  ) {
    this.runtime = new Runtime(this);
  }

  // -- publishing --------------------------------------------------------------------------

  #draft(event: EventDraft): EventDraft & { id: string } {
    if (event === null || typeof event !== "object" || typeof event.kind !== "string") {
      throw new BadRequest("not a valid event: an object with a kind", { field: "event" });
    }
    if (event.seq) {
      throw new BadRequest("a draft must not carry a seq (the log assigns it)", { field: "seq" });
    }
    return { ...event, id: event.id || eventId() };
  }

  /** Append one event; a missing `id` is minted here (UUIDv7), so a retry is idempotent.
   * `expectedSeq`: the head this write is based on. Rejects with `BadRequest`/`TooLarge`
   * (invalid), `Forbidden` (no write right, a hub-only kind, not the owner), `Conflict`
   * (stale `expectedSeq`/`baseRev`, a terminal or foreign item; `details.head`), `NotFound`,
   * `RateLimited` (still limited after the retries). */
  async publish(event: EventDraft, expectedSeq?: number): Promise<PublishAck> {
    const draft = this.#draft(event);
    const frame: Record<string, unknown> = { op: "publish", workspace: this.name, event: draft };
    if (expectedSeq !== undefined) frame.expectedSeq = expectedSeq;
    const reply = await this.#publish(frame);
    if (reply.op !== "ack" || typeof reply.seq !== "number") {
      throw new Internal(`unexpected reply to publish: ${reply.op}`);
    }
    const id = typeof reply.id === "string" ? reply.id : draft.id;
    return { workspace: this.name, seq: reply.seq, id, duplicate: reply.duplicate === true };
  }

  /** Append `events` atomically (all or none); an error's `details.index` names the event. */
  async publishBatch(events: EventDraft[], expectedSeq?: number): Promise<BatchAck> {
    const drafts = events.map((e) => this.#draft(e));
    if (drafts.length === 0) {
      throw new BadRequest("a batch needs at least one event", { field: "events" });
    }
    const frame: Record<string, unknown> = { op: "publish", workspace: this.name, events: drafts };
    if (expectedSeq !== undefined) frame.expectedSeq = expectedSeq;
    const reply = await this.#publish(frame);
    if (reply.op !== "ack" || !Array.isArray(reply.seqs)) {
      throw new Internal(`unexpected reply to publish: ${reply.op}`);
    }
    const ids = Array.isArray(reply.ids) ? (reply.ids as string[]) : drafts.map((d) => d.id);
    return {
      workspace: this.name,
      seqs: reply.seqs as number[],
      ids,
      duplicate: reply.duplicate === true,
    };
  }

  /** Send a publish; on `rateLimited` wait what the hub asked for (with backoff and jitter)
   * and send it again, at most `RATE_LIMIT_RETRIES` times. */
  async #publish(frame: Record<string, unknown>): Promise<Frame> {
    for (let attempt = 0; ;) {
      try {
        return await this.session.request(frame);
      } catch (e) {
        if (!(e instanceof RateLimited)) throw e;
        attempt += 1;
        if (!this.session.retryRateLimited || attempt > RATE_LIMIT_RETRIES) throw e;
        const ms = e.details.retryAfterMs;
        const wait = typeof ms === "number" ? ms / 1000 : 0.1;
        const backoff = new Backoff({
          initial: Math.max(0.001, wait),
          maximum: MAX_RATE_LIMIT_WAIT,
          giveUpAfter: null,
        });
        await sleep(backoff.delay(attempt - 1));
      }
    }
  }

  /** Publish `draft`; return it as stored (id, seq, workspace, producer filled in). */
  async #emit(draft: EventDraft, opens = false): Promise<AgoraEvent> {
    const prepared = this.#draft(draft);
    const ack = await this.publish(prepared);
    const stored = {
      ...prepared,
      id: ack.id,
      seq: ack.seq,
      workspace: this.name,
      producer: this.session.agent,
    } as AgoraEvent;
    this.#note(stored, opens);
    return stored;
  }

  // -- reading -----------------------------------------------------------------------------

  /** Every event with `seq > afterSeq` in order, then live ones; `afterSeq` null/omitted =
   * live only. The session follows the workspace from then on (one wire subscription shared
   * by every subscriber and waiter) until it closes or {@link leave} is called. */
  subscribe(afterSeq: number | null = null): Subscription {
    if (afterSeq !== null && (!Number.isInteger(afterSeq) || afterSeq < 0)) {
      throw new BadRequest("afterSeq must be an integer >= 0", { field: "afterSeq" });
    }
    const complete = afterSeq === 0;
    return new Subscription(this.session, this.name, afterSeq, (ev) => this.#note(ev, complete));
  }

  /** Stop following the workspace (unsubscribe); its subscriptions end. */
  leave(): void {
    this.session.existingFeed(this.name)?.leave();
  }

  /** The workspace state (files, work items, executions, artifacts, members), now or at
   * `atSeq`. Rejects with `Forbidden`, `BadRequest`, `TooLarge` (contents over the cap). */
  async state(options: StateOptions = {}): Promise<WorkspaceState> {
    const frame: Record<string, unknown> = { op: "state", workspace: this.name };
    if (options.atSeq !== undefined) frame.atSeq = options.atSeq;
    if (options.contents) frame.contents = true;
    if (options.paths !== undefined) frame.paths = [...options.paths];
    const reply = await this.session.request(frame);
    if (reply.op !== "state" || reply.state === null || typeof reply.state !== "object") {
      throw new Internal(`unexpected reply to state: ${reply.op}`);
    }
    return reply.state as WorkspaceState;
  }

  /** The seq of the workspace's last event (0 when empty). */
  async head(): Promise<number> {
    const sub = this.subscribe(null);
    try {
      return await sub.head();
    } finally {
      sub.close();
    }
  }

  /** The whole history: every event with `seq > afterSeq` up to the current head. */
  async events(afterSeq = 0): Promise<AgoraEvent[]> {
    const out: AgoraEvent[] = [];
    const sub = this.subscribe(afterSeq);
    try {
      const head = await sub.head();
      if (head <= afterSeq) return out;
      for await (const ev of sub) {
        out.push(ev);
        if (ev.seq >= head) return out;
      }
    } finally {
      sub.close();
    }
    throw new SessionClosed("the session closed while reading the history");
  }

  // -- files -------------------------------------------------------------------------------

  /** Write `path` (a string as UTF-8 text, bytes as base64). `baseRev`: the rev this write
   * replaces (0: the file must not exist; omitted: no check). Rejects with `Conflict` (stale
   * `baseRev`, `details.rev`), `BadRequest` (bad path), `TooLarge`. */
  async writeFile(
    path: string,
    content: string | Uint8Array,
    baseRev?: number,
    mediaType?: string,
  ): Promise<AgoraEvent> {
    const payload: Record<string, unknown> = { path };
    if (typeof content === "string") payload.text = content;
    else if (content instanceof Uint8Array) payload.base64 = bytesToBase64(content);
    else throw new BadRequest("content is a string or a Uint8Array", { field: "content" });
    if (baseRev !== undefined) payload.baseRev = baseRev;
    if (mediaType !== undefined) payload.mediaType = mediaType;
    return this.#emit({ kind: "fileWritten", payload } as unknown as EventDraft);
  }

  /** The current content of `path`: a string if written as text, else bytes. Rejects with
   * `NotFound` (no such file, or the content is in the blob store: `details.blob`). */
  async readFile(path: string): Promise<string | Uint8Array> {
    const state = await this.state({ contents: true, paths: [path] });
    const entry = state.files?.[path];
    if (entry === undefined) {
      throw new NotFound(`no file ${JSON.stringify(path)} in workspace ${this.name}`, { path });
    }
    if (typeof entry.text === "string") return entry.text;
    if (typeof entry.base64 === "string") return base64ToBytes(entry.base64);
    throw new NotFound(`${JSON.stringify(path)} is in the blob store; its content is not inline`, {
      path,
      blob: entry.blob,
    });
  }

  /** Delete `path`. Rejects with `NotFound`, `Conflict` (stale `baseRev`). */
  deleteFile(path: string, baseRev?: number): Promise<AgoraEvent> {
    const payload: Record<string, unknown> = { path };
    if (baseRev !== undefined) payload.baseRev = baseRev;
    return this.#emit({ kind: "fileDeleted", payload } as unknown as EventDraft);
  }

  /** Move `src` to `dst`. Rejects with `NotFound` (no `src`), `Conflict`. */
  moveFile(src: string, dst: string, baseRev?: number): Promise<AgoraEvent> {
    const payload: Record<string, unknown> = { from: src, to: dst };
    if (baseRev !== undefined) payload.baseRev = baseRev;
    return this.#emit({ kind: "fileMoved", payload } as unknown as EventDraft);
  }

  /** Post a conversation message. */
  postMessage(text?: string, data?: unknown): Promise<AgoraEvent> {
    const payload: Record<string, unknown> = {};
    if (text !== undefined) payload.text = text;
    if (data !== undefined) payload.data = data;
    return this.#emit({ kind: "messagePosted", payload } as unknown as EventDraft);
  }

  // -- work items (adk-code's verbs) -------------------------------------------------------

  /** Remember an item's topic (defaulted in later verbs) and, when `complete` (`ev` is
   * certainly the item's first event), its seq (waiters start there). */
  #note(ev: AgoraEvent, complete: boolean): void {
    const cid = ev.correlationId;
    if (typeof cid !== "string" || !COLLABORATION_KINDS.has(ev.kind)) return;
    const known = this.#items.get(cid);
    const topic = typeof ev.topic === "string" ? ev.topic : null;
    if (known !== undefined && (known[1] || !complete) && (known[0] || !topic)) return;
    const keptTopic = known?.[0] || topic;
    const first = known?.[1] || (complete ? ev.seq : 0);
    this.#items.delete(cid);
    this.#items.set(cid, [keptTopic ?? null, first]);
    if (this.#items.size > INDEX_SIZE) {
      const oldest = this.#items.keys().next();
      if (!oldest.done) this.#items.delete(oldest.value);
    }
  }

  #work(
    kind: string,
    correlationId: string,
    payload: unknown,
    options: WorkOptions = {},
  ): Promise<AgoraEvent> {
    const draft: Record<string, unknown> = { kind, correlationId };
    const topic = options.topic ?? this.#items.get(correlationId)?.[0] ?? undefined;
    if (topic !== undefined) draft.topic = topic;
    if (options.consumer !== undefined) draft.consumer = options.consumer;
    if (options.causationId !== undefined) draft.causationId = options.causationId;
    if (payload !== undefined) draft.payload = payload;
    return this.#emit(draft as unknown as EventDraft);
  }

  /** Open a work item (`needWork`) under a new correlationId; resolves with the stored
   * event (`correlationId`, `seq`). */
  requestWork(topic: string, payload?: unknown, consumer?: string): Promise<AgoraEvent> {
    const draft: Record<string, unknown> = { kind: "needWork", correlationId: uuid(), topic };
    if (payload !== undefined) draft.payload = payload;
    if (consumer !== undefined) draft.consumer = consumer;
    return this.#emit(draft as unknown as EventDraft, true);
  }

  /** Take ownership (`workClaimed`). Rejects with `Conflict` (claimed by another agent, or
   * the item is finished). */
  claimWork(correlationId: string, payload?: unknown, options?: WorkOptions): Promise<AgoraEvent> {
    return this.#work("workClaimed", correlationId, payload, options);
  }

  /** Announce a work product (`workPublished`). Rejects with `Forbidden` (not the owner). */
  publishWork(
    correlationId: string,
    payload?: unknown,
    options?: WorkOptions,
  ): Promise<AgoraEvent> {
    return this.#work("workPublished", correlationId, payload, options);
  }

  requestFeedback(
    correlationId: string,
    payload?: unknown,
    options?: WorkOptions,
  ): Promise<AgoraEvent> {
    return this.#work("feedbackRequested", correlationId, payload, options);
  }

  provideFeedback(
    correlationId: string,
    payload?: unknown,
    options?: WorkOptions,
  ): Promise<AgoraEvent> {
    return this.#work("feedbackProvided", correlationId, payload, options);
  }

  signalBlocked(
    correlationId: string,
    payload?: unknown,
    options?: WorkOptions,
  ): Promise<AgoraEvent> {
    return this.#work("blocked", correlationId, payload, options);
  }

  /** Close the item (`completed`, terminal). Rejects with `Forbidden`, `Conflict`. */
  signalCompleted(
    correlationId: string,
    payload?: unknown,
    options?: WorkOptions,
  ): Promise<AgoraEvent> {
    return this.#work("completed", correlationId, payload, options);
  }

  /** Cancel the item (`workCancelled`, terminal). */
  cancelWork(correlationId: string, payload?: unknown, options?: WorkOptions): Promise<AgoraEvent> {
    return this.#work("workCancelled", correlationId, payload, options);
  }

  // -- waiters -----------------------------------------------------------------------------

  #start(correlationId: string | null, afterSeq: number | undefined): number {
    if (afterSeq !== undefined) return afterSeq;
    if (correlationId !== null) {
      const known = this.#items.get(correlationId);
      if (known !== undefined && known[1] > 0) return known[1] - 1;
    }
    return 0;
  }

  /** Run `scan` over a subscription from `afterSeq` until it returns an event; reject with
   * {@link WaitTimeout} after `timeout` seconds. */
  async #wait<T>(
    afterSeq: number,
    timeout: number | undefined,
    what: string,
    scan: (sub: Subscription) => Promise<T | null>,
  ): Promise<T> {
    const sub = this.subscribe(afterSeq);
    let timer: ReturnType<typeof setTimeout> | null = null;
    let timedOut = false;
    if (timeout !== undefined) {
      timer = setTimeout(() => {
        timedOut = true;
        sub.close(); // ends the scan's iteration
      }, timeout * 1000);
    }
    try {
      let found: T | null;
      try {
        found = await scan(sub);
      } catch (e) {
        if (timedOut) throw new WaitTimeout(`no ${what} in ${timeout} s`);
        throw e;
      }
      if (found !== null) return found;
      if (timedOut) throw new WaitTimeout(`no ${what} in ${timeout} s`);
      throw new SessionClosed(`the session closed while waiting for ${what}`);
    } finally {
      if (timer !== null) clearTimeout(timer);
      sub.close();
    }
  }

  /** The first event of work item `correlationId` with `seq > afterSeq` (of one of `kinds`;
   * not produced by this agent if `excludeSelf`). Reads the log first, from `afterSeq`
   * (default: the item's first event, or the start of the log), then waits for live events,
   * so an event published before the call is found. */
  waitFor(correlationId: string, options: WaitOptions = {}): Promise<AgoraEvent> {
    const wanted = options.kinds !== undefined ? new Set(options.kinds) : null;
    const me = this.session.agent;
    const start = this.#start(correlationId, options.afterSeq);
    return this.#wait(start, options.timeout, `event of ${correlationId}`, async (sub) => {
      for await (const ev of sub) {
        if (ev.correlationId !== correlationId) continue;
        if (wanted !== null && !wanted.has(ev.kind)) continue;
        if (options.excludeSelf && ev.producer === me) continue;
        return ev;
      }
      return null;
    });
  }

  /** The first event of `kind` in work item `correlationId`; see {@link waitFor}. */
  waitForKind(
    correlationId: string,
    kind: string,
    options: Omit<WaitOptions, "kinds"> = {},
  ): Promise<AgoraEvent> {
    return this.waitFor(correlationId, { ...options, kinds: [kind] });
  }

  /** The first `feedbackProvided` of the item. */
  waitForFeedback(
    correlationId: string,
    options: Omit<WaitOptions, "kinds"> = {},
  ): Promise<AgoraEvent> {
    return this.waitForKind(correlationId, "feedbackProvided", options);
  }

  /** An open work request (`needWork`) on `topic` (any topic if omitted) addressed to this
   * agent or to anyone that nobody has claimed, completed or cancelled yet: the oldest in the
   * log from `afterSeq` to the head, else the next one published. */
  waitForWork(
    topic?: string,
    options: { timeout?: number; afterSeq?: number } = {},
  ): Promise<AgoraEvent> {
    const me = this.session.agent;
    const after = options.afterSeq ?? 0;
    return this.#wait(after, options.timeout, `work on ${topic ?? "any topic"}`, async (sub) => {
      const open = new Map<string, AgoraEvent>();
      const head = await sub.head();
      let caughtUp = head <= after;
      for await (const ev of sub) {
        const cid = ev.correlationId;
        if (ev.kind === "needWork") {
          if (
            typeof cid === "string" &&
            (topic === undefined || ev.topic === topic) &&
            (ev.consumer == null || ev.consumer === me) &&
            !open.has(cid)
          ) {
            open.set(cid, ev);
          }
        } else if (typeof cid === "string" && TAKEN.has(ev.kind)) {
          open.delete(cid);
        }
        if (ev.seq >= head) caughtUp = true;
        if (caughtUp && open.size) {
          const first = open.values().next();
          if (!first.done) return first.value;
        }
      }
      return null;
    });
  }
}
