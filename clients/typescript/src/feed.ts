/**
 * Feeds: one wire subscription per followed workspace, and local subscribers as cursors over
 * its window of recent events (hub/client/feed.py).
 *
 * The feed holds the contiguous seqs `first+1 .. position`; `position` is its resume cursor,
 * the seq of the last event it holds. An event at or below it is a duplicate (a replay after a
 * resubscribe) and is dropped; one beyond `position + 1` is a gap and makes the feed
 * resubscribe from `position`. After a reconnect the feed subscribes with `afterSeq` =
 * `position` (or the seq of a subscriber behind the window), so every subscriber sees every
 * event once, in order: no gap, no duplicate, across hub restarts. A subscriber that falls
 * behind the window makes the feed *rewind* (the hub replays from the log).
 */

import { type AgoraError, Busy, Internal, SessionClosed, Unavailable } from "./errors.js";
import type { StoredEvent } from "./generated/events.js";
import { EVENT_KINDS } from "./generated/kinds.js";
import type { Frame, Handler, Session } from "./session.js";

export const CATCH_UP_RETRIES = 5;

const KNOWN_KINDS: ReadonlySet<string> = new Set(EVENT_KINDS);

/** An event as stored and delivered (schemas/events.json), `seq` and all. */
export type AgoraEvent = StoredEvent & { seq: number; id: string; workspace: string };

class Unsubscribing implements Handler {
  onReply(): void {}
  onRefused(): void {}
  onAttach(): null {
    return null;
  }
  onDetach(): boolean {
    return false;
  }
  fail(): void {}
}

/** One local subscriber: the seq of the last event it was given. */
export class FeedReader {
  last: number | null;
  closed = false;
  error: AgoraError | null = null;
  readonly head: Promise<number>;
  #resolveHead!: (head: number) => void;
  #rejectHead!: (error: Error) => void;
  #headKnown = false;
  #wake: (() => void) | null = null;

  constructor(
    readonly feed: WorkspaceFeed,
    after: number | null,
  ) {
    this.last = after;
    this.head = new Promise<number>((resolve, reject) => {
      this.#resolveHead = resolve;
      this.#rejectHead = reject;
    });
    this.head.catch(() => undefined); // whoever awaits it sees the error
  }

  setHead(head: number): void {
    if (!this.#headKnown) {
      this.#headKnown = true;
      this.#resolveHead(head);
    }
  }

  /** End the subscriber: with `error`, or cleanly (iteration stops) when null. */
  finish(error: AgoraError | null): void {
    this.closed = true;
    if (error !== null && this.error === null) this.error = error;
    if (!this.#headKnown) {
      this.#headKnown = true;
      this.#rejectHead(error ?? new SessionClosed("the subscription was closed"));
    }
    this.wake();
  }

  wake(): void {
    const wake = this.#wake;
    this.#wake = null;
    wake?.();
  }

  /** The next event, or null when the subscriber was closed. */
  async next(): Promise<AgoraEvent | null> {
    const feed = this.feed;
    for (;;) {
      if (this.error !== null) throw this.error;
      if (this.closed) return null;
      if (this.last !== null) {
        const [found, ev] = feed.at(this.last + 1);
        if (found) {
          this.last += 1;
          if (ev !== null) return ev;
          continue; // a kind this client does not know: skipped, seq kept
        }
        if (this.last < feed.first) feed.rewind(this.last);
      }
      await new Promise<void>((resolve) => {
        this.#wake = resolve;
      });
    }
  }
}

/** The wire subscription of one workspace and a window of the events it delivered. */
export class WorkspaceFeed implements Handler {
  readonly readers = new Set<FeedReader>();
  window: (AgoraEvent | null)[] = [];
  first = 0; // the window holds seqs first+1 .. position
  position = 0;
  started = false; // a subscribe was confirmed: position means something
  head = 0;
  rid: number | null = null; // the subscribe in force, or awaiting its reply
  after: number | null = null; // its afterSeq
  confirmed = false;
  wanted: number | null = null; // a rewind asked for while a subscribe is pending
  failures = 0;
  retriedBusy = false;

  constructor(
    readonly session: Session,
    readonly workspace: string,
  ) {}

  at(seq: number): [boolean, AgoraEvent | null] {
    const index = seq - this.first - 1;
    if (this.started && index >= 0 && index < this.window.length) {
      return [true, this.window[index] ?? null];
    }
    return [false, null];
  }

  #wakeAll(): void {
    for (const reader of this.readers) reader.wake();
  }

  #append(ev: AgoraEvent | null): void {
    this.window.push(ev);
    const overflow = this.window.length - this.session.history;
    if (overflow > 0) {
      this.window.splice(0, overflow);
      this.first += overflow;
    }
  }

  #restart(after: number): void {
    this.window = [];
    this.first = after;
    this.position = after;
    this.started = true;
  }

  // -- local subscribers -------------------------------------------------------------------

  add(reader: FeedReader): void {
    this.readers.add(reader);
    if (this.rid === null) {
      this.subscribe(reader.last);
    } else if (this.confirmed) {
      const head = Math.max(this.head, this.position);
      if (reader.last === null) reader.last = head;
      reader.setHead(head);
      if (reader.last < this.first) this.rewind(reader.last);
    } else if (reader.last !== null) {
      this.rewind(reader.last);
    }
    this.#wakeAll();
  }

  remove(reader: FeedReader): void {
    this.readers.delete(reader);
  }

  /** End every local subscriber (with `error`, or cleanly when null) and forget the feed. */
  fail(error: AgoraError | null): void {
    for (const reader of this.readers) reader.finish(error);
    this.readers.clear();
    if (this.rid !== null) this.session.forget(this.rid);
    this.rid = null;
    this.confirmed = false;
    this.session.dropFeed(this);
  }

  /** Unsubscribe and forget the feed; local subscribers stop. */
  leave(): void {
    if (this.rid !== null) {
      this.session.forget(this.rid);
      this.#unsubscribe();
    }
    this.fail(null);
  }

  // -- wire --------------------------------------------------------------------------------

  /** (Re)subscribe from `after` (null: live only). */
  subscribe(after: number | null): void {
    this.wanted = null;
    if (!this.session.connected) {
      this.rid = null;
      return; // the next connection subscribes (onConnected)
    }
    if (this.rid !== null) {
      this.session.forget(this.rid);
      this.#unsubscribe();
    }
    this.after = after;
    this.confirmed = false;
    const rid = this.session.nextRid();
    this.rid = rid;
    // Registered until replaced: the hub may end the subscription later with an error
    // carrying its rid (a failed catch-up).
    this.session.expect(rid, this, false);
    const frame: Record<string, unknown> = { op: "subscribe", rid, workspace: this.workspace };
    if (after !== null) frame.afterSeq = after;
    this.session.send(JSON.stringify(frame));
  }

  #unsubscribe(): void {
    const rid = this.session.nextRid();
    this.session.expect(rid, new Unsubscribing(), true);
    this.session.send(JSON.stringify({ op: "unsubscribe", rid, workspace: this.workspace }));
  }

  /** A subscriber needs the events after `seq`, which the window does not hold. */
  rewind(seq: number): void {
    if (this.started && this.first <= seq) return;
    if (this.rid !== null && !this.confirmed) {
      if (this.after === null || seq < this.after) {
        this.wanted = this.wanted === null ? seq : Math.min(this.wanted, seq);
      }
      return;
    }
    this.subscribe(seq);
  }

  #resumePoint(): number | null {
    const behind: number[] = [];
    for (const r of this.readers) {
      if (r.last !== null && (!this.started || r.last < this.position)) behind.push(r.last);
    }
    if (this.started) return Math.min(this.position, ...behind);
    return behind.length ? Math.min(...behind) : null;
  }

  onConnected(): void {
    this.rid = null;
    this.confirmed = false;
    this.subscribe(this.#resumePoint());
  }

  onDisconnected(): void {
    this.rid = null;
    this.confirmed = false;
  }

  // -- Handler (replies to the subscribe) --------------------------------------------------

  onReply(frame: Frame): void {
    if (frame.op !== "subscribed" || frame.rid !== this.rid) return;
    this.confirmed = true;
    this.retriedBusy = false;
    const head = typeof frame.head === "number" ? frame.head : 0;
    this.head = head;
    const after = this.after ?? head;
    if (!this.started || after !== this.position) this.#restart(after);
    for (const reader of this.readers) {
      if (reader.last === null) reader.last = head;
      reader.setHead(head);
    }
    const wanted = this.wanted;
    this.wanted = null;
    const behind: number[] = [];
    for (const r of this.readers) if (r.last !== null && r.last < this.first) behind.push(r.last);
    if (wanted !== null && wanted < this.first) behind.push(wanted);
    if (behind.length) this.subscribe(Math.min(...behind));
    this.#wakeAll();
  }

  onRefused(error: AgoraError): void {
    if (error instanceof Busy && !this.retriedBusy && this.session.dropIdleFeed(this)) {
      // Too many subscriptions on this connection: an idle feed made room; try once more.
      this.retriedBusy = true;
      this.session.forget(this.rid ?? -1);
      this.rid = null;
      this.subscribe(this.after);
      return;
    }
    const serverError = error instanceof Unavailable || error instanceof Internal;
    if (error instanceof Busy || !this.confirmed || !serverError) {
      this.fail(error);
      return;
    }
    if (this.failures >= CATCH_UP_RETRIES) {
      this.fail(error);
      return;
    }
    // The hub could not read the catch-up and ended the subscription (docs/protocol.md,
    // "subscribe"): subscribe again from what we hold, after a pause.
    this.failures += 1;
    this.session.forget(this.rid ?? -1);
    this.rid = null;
    this.confirmed = false;
    setTimeout(
      () => {
        if (this.rid === null && this.session.existingFeed(this.workspace) === this) {
          this.subscribe(this.started ? this.position : this.#resumePoint());
        }
      },
      this.session.backoff.delay(this.failures) * 1000,
    );
  }

  onAttach(): null {
    return null; // onConnected subscribes (the session calls it before the handlers)
  }

  onDetach(): boolean {
    return false; // a subscribe dies with its connection
  }

  // -- events ------------------------------------------------------------------------------

  onEvent(raw: Record<string, unknown>): void {
    const seq = raw.seq;
    if (typeof seq !== "number") return;
    if (seq > this.head) this.head = seq;
    if (!this.started) return; // before the subscribe is confirmed: not ours to judge
    if (seq <= this.position) return; // already held (a replay)
    if (seq !== this.position + 1) {
      if (this.confirmed) this.subscribe(this.position); // a gap: read it from the log
      return;
    }
    this.position = seq;
    this.failures = 0;
    const known = typeof raw.kind === "string" && KNOWN_KINDS.has(raw.kind);
    this.#append(known ? (raw as unknown as AgoraEvent) : null);
    this.#wakeAll();
  }
}

/**
 * The events of one workspace with `seq > afterSeq`, in order, then live ones: an async
 * iterable (`for await (const ev of ws.subscribe(0))`). Every event comes once, in seq order,
 * across reconnects. Iterating rejects with what ended the session (`Unauthorized`,
 * `Unavailable` when reconnecting gave up) or the subscribe's error (`Forbidden` without the
 * read right, `BadRequest` for an `afterSeq` beyond the head); it ends when the session is
 * closed, {@link Subscription.close} is called or the workspace is left.
 */
export class Subscription implements AsyncIterableIterator<AgoraEvent> {
  #reader: FeedReader | null = null;
  #closedEarly = false;

  constructor(
    readonly session: Session,
    readonly workspace: string,
    readonly afterSeq: number | null,
    private readonly onEvent: (ev: AgoraEvent) => void = () => undefined,
  ) {}

  #start(): FeedReader {
    if (this.#reader === null) {
      this.session.checkUsable();
      const feed = this.session.feed(this.workspace);
      this.#reader = new FeedReader(feed, this.afterSeq);
      feed.add(this.#reader);
    }
    return this.#reader;
  }

  /** The workspace head when the subscription started: history up to it comes first. */
  head(): Promise<number> {
    if (this.#closedEarly) return Promise.reject(new SessionClosed("the subscription was closed"));
    return this.#start().head;
  }

  /** The seq of the last event delivered (`afterSeq` before the first). */
  get lastSeq(): number | null {
    return this.#reader !== null ? this.#reader.last : this.afterSeq;
  }

  async next(): Promise<IteratorResult<AgoraEvent, undefined>> {
    if (this.#closedEarly) return { done: true, value: undefined };
    const ev = await this.#start().next();
    if (ev === null) return { done: true, value: undefined };
    this.onEvent(ev);
    return { done: false, value: ev };
  }

  async return(): Promise<IteratorResult<AgoraEvent, undefined>> {
    this.close();
    return { done: true, value: undefined };
  }

  [Symbol.asyncIterator](): this {
    return this;
  }

  /** Stop receiving; idempotent. */
  close(): void {
    const reader = this.#reader;
    if (reader !== null) {
      if (!reader.closed) reader.finish(null);
      reader.feed.remove(reader);
    } else {
      this.#closedEarly = true;
    }
  }

  async [Symbol.asyncDispose](): Promise<void> {
    this.close();
  }
}
