/**
 * Typed errors: every `error` frame and every fatal close code becomes one of these classes
 * (docs/protocol.md, "Errors" and "Close codes"). The codes are those of the hub's one table,
 * `ERROR_TABLE` in hub/core/errors.py; tests/clients/test_typescript.py checks that
 * {@link ERROR_CODES} lists exactly them.
 */

export type Details = Record<string, unknown>;

/** The root of every error the client raises; `code` is the hub's wire code. */
export class AgoraError extends Error {
  readonly code: string = "internal";
  readonly details: Details;

  constructor(message: string, details: Details = {}) {
    super(message);
    this.name = new.target.name;
    this.details = details;
  }
}

/** Malformed input (a bad path, a wrong type); `details.field` names it. Nothing was written. */
export class BadRequest extends AgoraError {
  override readonly code = "badRequest";
}
/** No valid token (closes 4401; the session ends). `details.reason` says why. */
export class Unauthorized extends AgoraError {
  override readonly code = "unauthorized";
}
/** A missing right, a workspace not in the token, a hub-only kind, not the owner. */
export class Forbidden extends AgoraError {
  override readonly code = "forbidden";
}
export class NotFound extends AgoraError {
  override readonly code = "notFound";
}
/** Stale `expectedSeq` or `baseRev`, a foreign or finished work item (`details.head`, `rev`). */
export class Conflict extends AgoraError {
  override readonly code = "conflict";
}
export class TooLarge extends AgoraError {
  override readonly code = "tooLarge";
}
/** Over the publish rate; `details.retryAfterMs`. */
export class RateLimited extends AgoraError {
  override readonly code = "rateLimited";
}
export class Busy extends AgoraError {
  override readonly code = "busy";
}
export class Exists extends AgoraError {
  override readonly code = "exists";
}
/** The hub cannot be reached (or gave up on us); retry later. */
export class Unavailable extends AgoraError {
  override readonly code = "unavailable";
}
/** A bug on the hub's side, or a frame this client cannot read. */
export class Internal extends AgoraError {
  override readonly code = "internal";
}
/** The session was closed (by {@link Session.close}) before the call could complete. */
export class SessionClosed extends Unavailable {}

/** A waiter's timeout ran out (not a hub error: nothing was refused). */
export class WaitTimeout extends Error {
  constructor(message: string) {
    super(message);
    this.name = "TimeoutError";
  }
}

type ErrorClass = new (message: string, details?: Details) => AgoraError;

const BY_CODE: ReadonlyMap<string, ErrorClass> = new Map<string, ErrorClass>([
  ["badRequest", BadRequest],
  ["unauthorized", Unauthorized],
  ["forbidden", Forbidden],
  ["notFound", NotFound],
  ["conflict", Conflict],
  ["tooLarge", TooLarge],
  ["rateLimited", RateLimited],
  ["busy", Busy],
  ["exists", Exists],
  ["unavailable", Unavailable],
  ["internal", Internal],
]);

/** Every wire error code the hub sends (hub/core/errors.py `ERROR_TABLE`). */
export const ERROR_CODES: readonly string[] = [...BY_CODE.keys()];

/** The error an `error` frame stands for; an unknown code is read as `Internal`. */
export function errorFromFrame(code: unknown, message: unknown, details: unknown): AgoraError {
  const cls = (typeof code === "string" && BY_CODE.get(code)) || Internal;
  const text = typeof message === "string" ? message : String(code);
  const extra =
    details !== null && typeof details === "object" && !Array.isArray(details)
      ? (details as Details)
      : {};
  return new cls(text, extra);
}

/** Close codes after which reconnecting cannot help (hub/core/errors.py `FATAL_CLOSES`). */
export function closeError(code: number, reason: string): AgoraError | null {
  const text = `the hub closed the connection (${code}${reason ? `: ${reason}` : ""})`;
  switch (code) {
    case 4401: {
      const m = /^unauthorized: (.*)$/.exec(reason);
      return new Unauthorized(text, m ? { reason: m[1], closeCode: code } : { closeCode: code });
    }
    case 1008:
      return new BadRequest(text, { closeCode: code });
    case 1009:
      return new TooLarge(text, { closeCode: code });
    default:
      return null;
  }
}
