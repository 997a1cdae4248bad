/**
 * `@agora-hub/client`: the TypeScript client of the Agora hub (WebSocket protocol
 * `agora.v1`, docs/protocol.md), with the semantics of the Python client `hub.client`.
 *
 * ```ts
 * import { connect } from "@agora-hub/client";
 * const session = await connect("ws://127.0.0.1:8765", token);
 * const ws = session.workspace("demo");
 * const item = await ws.requestWork("parser", { spec: "…" });
 * const reply = await ws.waitForKind(item.correlationId!, "workPublished", { timeout: 60 });
 * await session.close();
 * ```
 */

export { Backoff, type BackoffOptions } from "./backoff.js";
export {
  AgoraError,
  BadRequest,
  Busy,
  Conflict,
  ERROR_CODES,
  Exists,
  Forbidden,
  Internal,
  NotFound,
  RateLimited,
  SessionClosed,
  TooLarge,
  Unauthorized,
  Unavailable,
  WaitTimeout,
  closeError,
  errorFromFrame,
  type Details,
} from "./errors.js";
export {
  type ExecOptions,
  type ExecOutcome,
  type ExecUpdate,
  ExecHandle,
  Runtime,
} from "./exec.js";
export { type AgoraEvent, CATCH_UP_RETRIES, Subscription } from "./feed.js";
export {
  DEFAULT_HISTORY,
  DEFAULT_MAX_FRAME,
  MAX_IDENTICAL_CLOSES,
  SUBPROTOCOL,
  Session,
  type SessionOptions,
  connect,
} from "./session.js";
export type { SocketFactory, SocketLike } from "./socket.js";
export {
  type BatchAck,
  type EventDraft,
  INDEX_SIZE,
  MAX_RATE_LIMIT_WAIT,
  type PublishAck,
  RATE_LIMIT_RETRIES,
  type StateOptions,
  type WaitOptions,
  type WorkOptions,
  Workspace,
} from "./workspace.js";
export { EVENT_KINDS } from "./generated/kinds.js";
export type * as events from "./generated/events.js";
export type * as protocol from "./generated/protocol.js";
export type { WorkspaceState, FileEntry, WorkItem, Member } from "./generated/workspace-state.js";
