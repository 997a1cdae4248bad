/**
 * Retry delays, as hub/core/backoff.py: `initial * factor ** attempt` capped at `maximum`,
 * times a jitter in `[1 - jitter, 1]` so that many clients do not reconnect in step.
 */
export interface BackoffOptions {
  initial?: number;
  maximum?: number;
  factor?: number;
  jitter?: number;
  /** Seconds a caller keeps retrying before it gives up (null: never). */
  giveUpAfter?: number | null;
}

export class Backoff {
  readonly initial: number;
  readonly maximum: number;
  readonly factor: number;
  readonly jitter: number;
  readonly giveUpAfter: number | null;

  constructor(options: BackoffOptions = {}) {
    this.initial = options.initial ?? 0.05;
    this.maximum = options.maximum ?? 2.0;
    this.factor = options.factor ?? 2.0;
    this.jitter = options.jitter ?? 0.5;
    this.giveUpAfter = options.giveUpAfter === undefined ? 30.0 : options.giveUpAfter;
  }

  /** Seconds before retry number `attempt` (0 for the first). */
  delay(attempt: number, rand: () => number = Math.random): number {
    const exp = Math.min(Math.max(attempt, 0), 64);
    const base = Math.min(this.maximum, this.initial * this.factor ** exp);
    return base * (1 - this.jitter * rand());
  }
}

export function sleep(seconds: number): Promise<void> {
  return new Promise((resolve) => setTimeout(resolve, Math.max(0, seconds * 1000)));
}
