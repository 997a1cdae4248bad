/**
 * The session: one connection to a hub at a time, reconnecting and resuming (`agora.v1`,
 * docs/protocol.md); the TypeScript twin of hub/client/session.py.
 *
 * - **Nothing is lost silently.** After a dropped connection, a hub restart (1001, 1006) or a
 *   4408 (too slow) close the session reconnects with {@link Backoff} and every followed
 *   workspace resubscribes from the seq of the last event it holds ({@link WorkspaceFeed}), so
 *   subscribers see every event once, in order.
 * - **Retries are idempotent.** Requests in flight when a connection drops are sent again on
 *   the next one (publishes carry client-minted ids: the hub answers a repeat as `duplicate`);
 *   an `exec` is never sent twice.
 * - **Typed errors.** `error` frames become {@link AgoraError} classes; close codes that must
 *   not be retried (4401, 1008, 1009) end the session with `Unauthorized`, `BadRequest`,
 *   `TooLarge`; so does the same close repeated `maxIdenticalCloses` times with nothing
 *   delivered in between (no silent endless reconnect).
 * - **Failover.** Given several nodes of one hub (`connect([url1, url2], token)`, nodes that
 *   share one PostgreSQL log), the session opens on the first that answers; when its node
 *   closes the connection (but for a normal close or 4408) and on each failed attempt, it
 *   moves to the next one (round robin, under the backoff); feeds resume by seq, which every
 *   node agrees on: no gap, no duplicate.
 */

import { Backoff, type BackoffOptions, sleep } from "./backoff.js";
import {
  AgoraError,
  BadRequest,
  Internal,
  SessionClosed,
  Unauthorized,
  Unavailable,
  closeError,
  errorFromFrame,
} from "./errors.js";
import type { Welcome } from "./generated/protocol.js";
import { WorkspaceFeed } from "./feed.js";
import {
  type SocketFactory,
  type SocketLike,
  defaultFactory,
  isOpen,
  messageText,
} from "./socket.js";
import { Workspace } from "./workspace.js";

export const SUBPROTOCOL = "agora.v1";
export const DEFAULT_HISTORY = 4096;
export const DEFAULT_MAX_FRAME = 64 * 1024 * 1024;
export const MAX_IDENTICAL_CLOSES = 5;
/** Closes after which a session given several nodes reconnects to the same node (a normal
 * close, or this client reading too slowly); after any other it tries the next node first. */
const STAY_CLOSES: ReadonlySet<number> = new Set([1000, 4408]);

/** A server frame as read: every frame has an `op`; the rest is read leniently. */
export type Frame = { op: string; rid?: number | string | null } & Record<string, unknown>;

/** Something the session routes the replies of one rid to. */
export interface Handler {
  /** A reply frame (not an `error`) with this handler's rid. */
  onReply(frame: Frame): void;
  /** An `error` frame with this handler's rid. */
  onRefused(error: AgoraError): void;
  /** A new connection: the frame to send on it (again), or null. */
  onAttach(): string | null;
  /** The connection ended; return false to be forgotten (subscribes die with it). */
  onDetach(): boolean;
  /** The session ended. */
  fail(error: AgoraError): void;
}

export interface SessionOptions {
  /** Reconnect and resume after a dropped connection (default true). */
  reconnect?: boolean;
  backoff?: Backoff | BackoffOptions;
  /** Recent events kept per followed workspace for subscribers and waiters. */
  history?: number;
  /** A publish refused with `rateLimited` is sent again after the wait the hub names. */
  retryRateLimited?: boolean;
  /** Seconds for the handshake and `welcome`. */
  openTimeout?: number;
  maxFrameBytes?: number;
  maxIdenticalCloses?: number;
  /**
   * Called before the token expires (`refreshMargin` seconds before `expiresAt`) for a fresh
   * token for the same agent, which is sent with `hello` ({@link Session.refresh}).
   */
  tokenProvider?: () => Promise<string> | string;
  refreshMargin?: number;
  /** Build sockets yourself (default: `ws` on Node, the global `WebSocket` in browsers). */
  socketFactory?: SocketFactory;
}

class PendingRequest implements Handler {
  constructor(
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
  onAttach(): string {
    return this.data;
  }
  onDetach(): boolean {
    return true;
  }
  fail(error: AgoraError): void {
    this.reject(error);
  }
}

interface Closed {
  code: number;
  reason: string;
}

/** The nodes a session may use: one URL, or several nodes of one hub in order of preference.
 * Throws `BadRequest` for an empty list, or a URL that is empty or does not parse. */
function nodeUrls(url: string | readonly string[]): readonly string[] {
  const urls = typeof url === "string" ? [url] : [...url];
  if (urls.length === 0 || !urls.every((u) => typeof u === "string" && u.length > 0)) {
    throw new BadRequest("url: a hub URL, or a non-empty list of them", { field: "url" });
  }
  for (const u of urls) {
    // Every node's URL checked now: a bad second one must not surface only at failover.
    try {
      new URL(u);
    } catch {
      throw new BadRequest(`invalid hub URL ${JSON.stringify(u)}`, { field: "url" });
    }
  }
  return Object.freeze(urls);
}

/** A connection to one hub, reconnecting as needed. Build it with {@link connect}. */
export class Session {
  /** The hub nodes this session may use, in order of preference (see {@link connect}). */
  readonly urls: readonly string[];
  agent = "";
  rights: string[] = [];
  server = "";
  /** Epoch seconds when the current token expires (0: unknown). */
  expiresAt = 0;
  /** The close code and reason of the last connection that ended. */
  lastClose: Closed | null = null;
  readonly history: number;
  readonly retryRateLimited: boolean;
  readonly backoff: Backoff;

  #token: string;
  #options: SessionOptions;
  #factory: SocketFactory | null;
  #socket: SocketLike | null = null; // attached: ready to send
  #rid = 0;
  #handlers = new Map<number, Handler>();
  #once = new Set<number>();
  #feeds = new Map<string, WorkspaceFeed>();
  #workspaces = new Map<string, Workspace>();
  #failure: AgoraError | null = null;
  #closing = false;
  #opened = false;
  #reconnects = 0;
  #delivered = 0;
  #run: Promise<void> | null = null;
  #wakeClose: (() => void) | null = null;
  #refreshTimer: ReturnType<typeof setTimeout> | null = null;
  #inbox: unknown[] = []; // frames read, not yet dispatched (see #receive)
  #pumping = false;
  #at = 0; // index in urls of the node in use (or tried next)

  constructor(url: string | readonly string[], token: string, options: SessionOptions = {}) {
    this.urls = nodeUrls(url);
    this.#token = token;
    this.#options = options;
    this.#factory = options.socketFactory ?? null;
    this.history = Math.max(1, options.history ?? DEFAULT_HISTORY);
    this.retryRateLimited = options.retryRateLimited ?? true;
    this.backoff =
      options.backoff instanceof Backoff ? options.backoff : new Backoff(options.backoff);
  }

  /** The URL of the node in use (or the one tried next). */
  get url(): string {
    return this.urls[this.#at] as string;
  }

  /** How many times the session reconnected. */
  get reconnects(): number {
    return this.#reconnects;
  }

  /** Whether the session was closed or failed for good. */
  get closed(): boolean {
    return this.#closing || this.#failure !== null;
  }

  /** Connect and authenticate. Rejects with `Unauthorized` (bad or expired token),
   * `Unavailable` (the hub cannot be reached) or the error the hub answered `hello` with. */
  async open(): Promise<this> {
    if (this.#opened) throw new BadRequest("a session can be opened once");
    this.#opened = true;
    this.#factory ??= await defaultFactory();
    const socket = await this.#firstHandshake();
    this.#run = this.#serveLoop(socket);
    return this;
  }

  /** Open on the first node of {@link urls} that answers; the last `Unavailable` when none
   * does. Any other refusal (a bad token) is every node's answer: rejected at once. */
  async #firstHandshake(): Promise<SocketLike> {
    for (let at = 0; ; at += 1) {
      this.#at = at;
      try {
        return await this.#handshake();
      } catch (e) {
        if (!(e instanceof Unavailable) || at === this.urls.length - 1) throw e;
      }
    }
  }

  /** Close the connection and end every subscription and pending call. Idempotent. */
  async close(): Promise<void> {
    if (!this.#closing) {
      this.#closing = true;
      this.#clearRefresh();
      const socket = this.#socket;
      this.#socket = null;
      this.#fail(new SessionClosed("the session is closed"), true);
      socket?.close(1000);
      this.#wakeClose?.();
    }
    await this.#run?.catch(() => undefined);
  }

  async [Symbol.asyncDispose](): Promise<void> {
    await this.close();
  }

  /** A handle on workspace `name` (cheap; the same object for the same name). */
  workspace(name: string): Workspace {
    let ws = this.#workspaces.get(name);
    if (ws === undefined) {
      ws = new Workspace(this, name);
      this.#workspaces.set(name, ws);
    }
    return ws;
  }

  /** Replace the token (before it expires) with a fresh one for the same agent; reconnects
   * use it too. Rejects with `Forbidden` (another agent, or the new token lacks the read right
   * on a followed workspace: the old token stays in force) or `Unauthorized` (the session
   * ends). */
  async refresh(token: string): Promise<void> {
    const reply = await this.request({ op: "hello", token });
    if (reply.op !== "welcome") throw new Internal(`unexpected reply to hello: ${reply.op}`);
    this.#token = token;
    this.#welcome(reply as unknown as Welcome);
  }

  /** Send `frame` (its `rid` is set here) and resolve with the reply. Sent again after a
   * reconnect until answered: only for idempotent requests. */
  request(frame: Record<string, unknown>): Promise<Frame> {
    this.checkUsable();
    const rid = this.nextRid();
    const data = JSON.stringify({ ...frame, rid });
    return new Promise<Frame>((resolve, reject) => {
      const done = (): void => {
        this.forget(rid);
      };
      this.expect(
        rid,
        new PendingRequest(
          data,
          (f) => {
            done();
            resolve(f);
          },
          (e) => {
            done();
            reject(e);
          },
        ),
        true,
      );
      this.send(data);
    });
  }

  // -- for feeds, workspaces and executions ------------------------------------------------

  /** @internal */
  nextRid(): number {
    this.#rid += 1;
    return this.#rid;
  }

  /** @internal Route the replies of `rid` to `handler` (`once`: forget it after one). */
  expect(rid: number, handler: Handler, once: boolean): void {
    this.#handlers.set(rid, handler);
    if (once) this.#once.add(rid);
    else this.#once.delete(rid);
  }

  /** @internal */
  forget(rid: number): void {
    this.#handlers.delete(rid);
    this.#once.delete(rid);
  }

  /** @internal Send on the current connection (dropped when there is none: the handlers
   * send their frames again on the next). */
  send(data: string): void {
    const socket = this.#socket;
    if (socket !== null && isOpen(socket)) socket.send(data);
  }

  /** @internal */
  get connected(): boolean {
    return this.#socket !== null;
  }

  /** @internal */
  checkUsable(): void {
    if (this.#failure !== null) throw this.#failure;
    if (this.#closing || !this.#opened) {
      throw new SessionClosed(this.#opened ? "the session is closed" : "the session is not open");
    }
  }

  /** @internal The feed of `workspace`, created on first use. */
  feed(workspace: string): WorkspaceFeed {
    let feed = this.#feeds.get(workspace);
    if (feed === undefined) {
      feed = new WorkspaceFeed(this, workspace);
      this.#feeds.set(workspace, feed);
    }
    return feed;
  }

  /** @internal */
  existingFeed(workspace: string): WorkspaceFeed | undefined {
    return this.#feeds.get(workspace);
  }

  /** @internal Unsubscribe the oldest followed workspace no one is reading (the hub limits
   * subscriptions per connection); false if there is none. */
  dropIdleFeed(except: WorkspaceFeed): boolean {
    for (const feed of this.#feeds.values()) {
      if (feed !== except && feed.readers.size === 0 && feed.confirmed) {
        feed.leave();
        return true;
      }
    }
    return false;
  }

  /** @internal */
  dropFeed(feed: WorkspaceFeed): void {
    if (this.#feeds.get(feed.workspace) === feed) this.#feeds.delete(feed.workspace);
  }

  // -- connection --------------------------------------------------------------------------

  async #handshake(): Promise<SocketLike> {
    const factory = this.#factory;
    if (factory === null) throw new Internal("no socket factory");
    const maxFrame = this.#options.maxFrameBytes ?? DEFAULT_MAX_FRAME;
    const timeout = (this.#options.openTimeout ?? 10) * 1000;
    let socket: SocketLike;
    try {
      socket = factory(this.url, [SUBPROTOCOL], maxFrame);
    } catch (e) {
      throw new BadRequest(`invalid hub URL ${JSON.stringify(this.url)}: ${String(e)}`, {
        field: "url",
      });
    }
    socket.binaryType = "arraybuffer";
    return new Promise<SocketLike>((resolve, reject) => {
      let settled = false;
      const finish = (error: AgoraError | null): void => {
        if (settled) return;
        settled = true;
        clearTimeout(timer);
        socket.onopen = socket.onmessage = socket.onerror = socket.onclose = null;
        if (error === null) {
          resolve(socket);
        } else {
          socket.onerror = () => undefined; // a late 'error' event must not go unhandled
          socket.close();
          reject(error);
        }
      };
      const timer = setTimeout(() => {
        finish(new Unavailable(`no welcome from ${this.url} in time`, { url: this.url }));
      }, timeout);
      socket.onopen = () => {
        socket.send(JSON.stringify({ op: "hello", rid: 0, token: this.#token }));
      };
      socket.onerror = () => undefined; // the close event that follows says what happened
      socket.onclose = (ev) => {
        const fatal = closeError(ev.code, ev.reason);
        finish(
          fatal ??
            new Unavailable(`cannot connect to ${this.url} (${ev.code} ${ev.reason})`, {
              url: this.url,
              closeCode: ev.code,
            }),
        );
      };
      socket.onmessage = (ev) => {
        const frame = parseFrame(ev.data);
        if (frame === null) {
          finish(new Internal("the hub sent a frame this client cannot read during hello"));
        } else if (frame.op === "welcome") {
          this.#welcome(frame as unknown as Welcome);
          finish(null);
        } else if (frame.op === "error") {
          finish(errorFromFrame(frame.code, frame.message, frame.details));
        }
      };
    });
  }

  #welcome(frame: Welcome): void {
    this.agent = frame.agent;
    this.rights = [...frame.rights];
    this.server = frame.server;
    this.expiresAt = frame.expiresAt ?? 0;
    this.#scheduleRefresh();
  }

  #scheduleRefresh(): void {
    this.#clearRefresh();
    const provider = this.#options.tokenProvider;
    if (provider === undefined || this.expiresAt <= 0 || this.#closing) return;
    const margin = this.#options.refreshMargin ?? 60;
    const wait = Math.max(1000, (this.expiresAt - margin) * 1000 - Date.now());
    const timer = setTimeout(() => {
      this.#refreshTimer = null;
      void (async () => {
        try {
          await this.refresh(await provider());
        } catch {
          // Try again shortly; if the token ends first the hub closes with 4401 and the
          // session fails with Unauthorized on its own.
          if (!this.closed) this.#scheduleRefreshRetry();
        }
      })();
    }, wait);
    (timer as { unref?: () => void }).unref?.();
    this.#refreshTimer = timer;
  }

  #scheduleRefreshRetry(): void {
    const timer = setTimeout(() => {
      this.#refreshTimer = null;
      this.#scheduleRefresh();
    }, 5000);
    (timer as { unref?: () => void }).unref?.();
    this.#refreshTimer = timer;
  }

  #clearRefresh(): void {
    if (this.#refreshTimer !== null) clearTimeout(this.#refreshTimer);
    this.#refreshTimer = null;
  }

  /** The session's loop: serve one connection after another until a fatal close. */
  async #serveLoop(first: SocketLike): Promise<void> {
    let socket: SocketLike | null = first;
    let repeats = 0;
    const limit = Math.max(1, this.#options.maxIdenticalCloses ?? MAX_IDENTICAL_CLOSES);
    try {
      while (socket !== null) {
        const delivered = this.#delivered;
        const closed = await this.#serve(socket);
        if (this.#closing) return;
        const last = this.lastClose;
        const same =
          last !== null &&
          last.code === closed.code &&
          last.reason === closed.reason &&
          this.#delivered === delivered;
        repeats = same && closed.code !== 1001 ? repeats + 1 : 1;
        this.lastClose = closed;
        let fatal = this.#failure ?? closeError(closed.code, closed.reason);
        if (fatal === null && repeats >= limit) {
          fatal = new Unavailable(
            `the hub closed ${repeats} connections in a row the same way (${closed.code}: ` +
              `${closed.reason || "no reason"}) with nothing delivered; giving up`,
            { closeCode: closed.code, repeats },
          );
        }
        if (fatal === null && this.#options.reconnect === false) {
          fatal = new Unavailable(
            `the hub closed the connection (${closed.code}: ${closed.reason || "no reason"})`,
            { closeCode: closed.code },
          );
        }
        if (fatal !== null) throw fatal;
        if (this.urls.length > 1 && !STAY_CLOSES.has(closed.code)) {
          // The node's own trouble (going away, cut off, "try again"): the next node first.
          // A node that answers and then closes (it cannot reach a workspace's owner) would
          // otherwise be retried until giving up.
          this.#at = (this.#at + 1) % this.urls.length;
        }
        socket = await this.#reconnect();
        if (socket !== null) this.#reconnects += 1;
      }
    } catch (e) {
      const error = e instanceof AgoraError ? e : new Internal(`client failure: ${String(e)}`, {});
      this.#fail(error, false);
    }
  }

  /** Handshake again with backoff; null when the session was closed meanwhile. */
  async #reconnect(): Promise<SocketLike | null> {
    const started = Date.now();
    const giveUp = this.backoff.giveUpAfter;
    let last: unknown = null;
    for (let attempt = 0; ; attempt += 1) {
      const delay = this.backoff.delay(attempt);
      if (giveUp !== null && (Date.now() - started) / 1000 + delay > giveUp) {
        throw new Unavailable(`could not reconnect to ${this.url} in ${giveUp} s: ${last}`, {
          url: this.url,
        });
      }
      await sleep(delay);
      if (this.#closing) return null;
      try {
        const socket = await this.#handshake();
        if (this.#closing) {
          socket.close(1000);
          return null;
        }
        return socket;
      } catch (e) {
        if (e instanceof Unauthorized || e instanceof BadRequest) throw e;
        if (!(e instanceof AgoraError)) throw e;
        last = e.message;
        // Fail over: the next attempt goes to the next node (round robin). Feeds resume by
        // seq, which every node sharing the log agrees on: no gap, no duplicate.
        this.#at = (this.#at + 1) % this.urls.length;
      }
    }
  }

  /** Attach `socket`, read it until it closes; resolve with the close code and reason. */
  #serve(socket: SocketLike): Promise<Closed> {
    return new Promise<Closed>((resolve) => {
      let ended = false;
      const end = (closed: Closed): void => {
        if (ended) return;
        ended = true;
        this.#wakeClose = null;
        socket.onmessage = socket.onclose = null;
        socket.onerror = () => undefined;
        this.#detach();
        resolve(closed);
      };
      this.#wakeClose = () => {
        this.#inbox = [];
        end({ code: 1000, reason: "closed by the client" });
      };
      socket.onmessage = (ev) => this.#receive(ev.data);
      socket.onerror = () => undefined;
      socket.onclose = (ev) => {
        // Every frame read before the close is dispatched before the connection ends.
        const closed = { code: ev.code, reason: ev.reason ?? "" };
        const finish = (): void => {
          if (this.#inbox.length && !ended && nextTask !== null) nextTask(finish);
          else end(closed);
        };
        finish();
      };
      this.#attach(socket);
    });
  }

  #attach(socket: SocketLike): void {
    this.#socket = socket;
    // Everything pending now is sent here, in the order first sent; the feeds resubscribe.
    const waiting = [...this.#handlers.values()];
    for (const feed of [...this.#feeds.values()]) feed.onConnected();
    for (const handler of waiting) {
      const data = handler.onAttach();
      if (data !== null) this.send(data);
    }
  }

  #detach(): void {
    this.#socket = null;
    for (const [rid, handler] of [...this.#handlers]) {
      if (!handler.onDetach()) this.forget(rid);
    }
    for (const feed of this.#feeds.values()) feed.onDisconnected();
  }

  #fail(error: AgoraError, clean: boolean): void {
    this.#failure ??= error;
    this.#clearRefresh();
    const handlers = [...this.#handlers.values()];
    this.#handlers.clear();
    this.#once.clear();
    for (const handler of handlers) {
      // Feeds are registered under their subscribe's rid too; they end below, cleanly when
      // the user closed the session (iterations stop instead of throwing).
      if (!(handler instanceof WorkspaceFeed)) handler.fail(error);
    }
    for (const feed of [...this.#feeds.values()]) feed.fail(clean ? null : error);
    this.#feeds.clear();
  }

  // -- frames ------------------------------------------------------------------------------

  /** Queue a frame read from the socket. `ws` hands over every frame of one TCP read in one
   * go; dispatching them one task at a time lets subscribers run between events (as a
   * browser's WebSocket does by itself). Without it a burst (a catch-up) runs through a feed's
   * window before its readers get to run, every reader rewinds, and each rewind's
   * resubscribe brings the same burst again: a livelock (the Python client yields per frame
   * for the same reason). */
  #receive(data: unknown): void {
    if (nextTask === null) {
      this.#dispatch(data);
      return;
    }
    this.#inbox.push(data);
    if (!this.#pumping) {
      this.#pumping = true;
      nextTask(this.#pump);
    }
  }

  #pump = (): void => {
    const data = this.#inbox.shift();
    if (data !== undefined) this.#dispatch(data);
    if (this.#inbox.length && nextTask !== null) nextTask(this.#pump);
    else this.#pumping = false;
  };

  #dispatch(data: unknown): void {
    const frame = parseFrame(data);
    if (frame === null) return; // not a JSON object: nothing to route it to
    if (frame.op === "event") {
      const workspace = frame.workspace;
      const event = frame.event;
      if (typeof workspace !== "string" || event === null || typeof event !== "object") return;
      this.#delivered += 1;
      this.#feeds.get(workspace)?.onEvent(event as Record<string, unknown>);
      return;
    }
    const rid = frame.rid;
    const handler = typeof rid === "number" ? this.#handlers.get(rid) : undefined;
    if (frame.op === "error") {
      const error = errorFromFrame(frame.code, frame.message, frame.details);
      if (handler === undefined || typeof rid !== "number") {
        // No request of ours: a notice. `unauthorized` means the hub closes with 4401 next.
        if (error instanceof Unauthorized) this.#failure ??= error;
        return;
      }
      handler.onRefused(error);
      return;
    }
    if (handler === undefined || typeof rid !== "number") return;
    if (this.#once.has(rid)) this.forget(rid);
    handler.onReply(frame);
  }
}

/** Run `fn` in a later task of the event loop (`setImmediate`: after pending I/O and every
 * microtask); null where there is none (browsers, whose WebSocket dispatches each message as
 * a task of its own). */
const nextTask: ((fn: () => void) => void) | null =
  typeof (globalThis as { setImmediate?: unknown }).setImmediate === "function"
    ? (fn) => {
        (globalThis as unknown as { setImmediate: (f: () => void) => void }).setImmediate(fn);
      }
    : null;

function parseFrame(data: unknown): Frame | null {
  const text = messageText(data);
  if (text === null) return null;
  try {
    const value: unknown = JSON.parse(text);
    if (value !== null && typeof value === "object" && !Array.isArray(value)) {
      const op = (value as { op?: unknown }).op;
      if (typeof op === "string") return value as Frame;
    }
  } catch {
    // fall through: an unreadable frame is dropped
  }
  return null;
}

/** A session with the hub at `url` (`ws://host:port`) authenticated by `token`, opened.
 * `url` may list several nodes of one hub (`["ws://node-a:8765", "ws://node-b:8765"]`): the
 * session opens on the first that answers and fails over to the next when its node goes away.
 *
 * ```ts
 * const session = await connect("ws://127.0.0.1:8765", token);
 * const ws = session.workspace("demo");
 * await ws.postMessage("hello");
 * await session.close();
 * ```
 */
export async function connect(
  url: string | readonly string[],
  token: string,
  options: SessionOptions = {},
): Promise<Session> {
  return new Session(url, token, options).open();
}
