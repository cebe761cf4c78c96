// When the client retries a request, and how long it waits first: the Python SDK's rules
// (lantern/sdk/retry.py). Safe calls (every GET, and creating a run or sending a signal, which
// always carry an idempotency key) are retried on a network error and on 429, 502, 503 and
// 504. The others (cancel, approve, retry, applying an agent) only when the request provably
// never left: the connection could not be made. Waits grow exponentially with full jitter, and
// a Retry-After from the server wins.

export const RETRY_STATUSES: ReadonlySet<number> = new Set([429, 502, 503, 504]);

// Node's fetch names the cause of a failed connection; a browser's does not, and its errors are
// then treated as "maybe sent".
const NOT_SENT_CODES: ReadonlySet<string> = new Set([
  "ECONNREFUSED",
  "ENOTFOUND",
  "EAI_AGAIN",
  "EHOSTUNREACH",
  "ENETUNREACH",
  "UND_ERR_CONNECT_TIMEOUT",
]);

export class Backoff {
  constructor(
    readonly baseMs = 200,
    readonly capMs = 5000,
    // The longest Retry-After the client honours; a longer one is cut to this.
    readonly maxRetryAfterMs = 60_000,
  ) {}

  /** The longest wait before retry number `attempt + 1` (`attempt` counts from 0). */
  ceiling(attempt: number): number {
    return Math.min(this.capMs, this.baseMs * 2 ** Math.min(attempt, 62));
  }

  delay(attempt: number, retryAfterMs?: number | null): number {
    if (retryAfterMs !== undefined && retryAfterMs !== null) {
      return Math.min(Math.max(retryAfterMs, 0), this.maxRetryAfterMs);
    }
    return Math.random() * this.ceiling(attempt);
  }
}

export function retryStatus(status: number, safe: boolean): boolean {
  // A 429 was refused before anything was done, so even an unsafe call may try again.
  return status === 429 || (safe && RETRY_STATUSES.has(status));
}

export function retryNetworkError(error: unknown, safe: boolean): boolean {
  return safe || notSent(error);
}

/** Whether a fetch failure happened before the request could have reached the server. */
export function notSent(error: unknown): boolean {
  for (let cause = error; typeof cause === "object" && cause !== null; ) {
    const code = (cause as { code?: unknown }).code;
    if (typeof code === "string" && NOT_SENT_CODES.has(code)) return true;
    const errors = (cause as { errors?: unknown }).errors; // one per address tried
    if (Array.isArray(errors) && errors.length > 0 && errors.every(notSent)) return true;
    cause = (cause as { cause?: unknown }).cause;
  }
  return false;
}

/** Milliseconds to wait from a Retry-After header: delta-seconds or an HTTP date. */
export function parseRetryAfter(value: string | null, now: number = Date.now()): number | null {
  if (!value?.trim()) return null;
  const trimmed = value.trim();
  if (/^\d+(\.\d+)?$/.test(trimmed)) return Number(trimmed) * 1000;
  const when = Date.parse(trimmed);
  return Number.isNaN(when) ? null : Math.max(when - now, 0);
}

export function describe(error: unknown): string {
  const parts: string[] = [];
  for (let cause = error; cause instanceof Error; cause = cause.cause) {
    const code = (cause as { code?: unknown }).code;
    parts.push(typeof code === "string" ? `${cause.message} (${code})` : cause.message);
  }
  return parts.join(": ") || String(error);
}
