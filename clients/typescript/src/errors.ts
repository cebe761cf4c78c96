// What the client throws: every error is a LanternError, the same tree as the Python SDK's
// (lantern/sdk/errors.py), so `catch (e) { if (e instanceof NotFoundError) ... }` reads alike.
//
//   LanternError
//   ├── ApiError                 the server answered with an error (RFC 9457 problem+json)
//   │   ├── BadRequest           400 malformed body
//   │   ├── AuthenticationError  401 no or unknown API key
//   │   ├── PermissionDenied     403 missing scope, or another workspace's object
//   │   ├── NotFoundError        404 unknown run or agent
//   │   ├── ConflictError        409 a reused idempotency key, a finished run, a node not waiting
//   │   ├── PayloadTooLarge      413 body too large
//   │   ├── Unprocessable        422 invalid definition or input (`errors` lists every problem)
//   │   ├── RateLimited          429 (thrown once retries are spent)
//   │   └── ServerError          5xx (thrown once retries are spent, for the calls retried)
//   ├── ConnectionFailed         no answer: a network error, after every retry
//   ├── InvalidResponse          an answer that is not the API's shape (a wrong URL? a proxy?)
//   ├── WaitTimeout              wait() gave up before the run finished
//   └── UsageError               the client was called wrongly (no URL, no key, a bad argument)
import type { Problem, Run } from "./types.js";

export class LanternError extends Error {
  constructor(message: string, options?: { cause?: unknown }) {
    super(message, options);
    this.name = new.target.name;
  }
}

/** The server answered with an error status; `problem` is its problem+json document. */
export class ApiError extends LanternError {
  readonly status: number;
  readonly type: string;
  readonly title: string;
  readonly detail: string;
  readonly problem: Partial<Problem> & Record<string, unknown>;

  constructor(status: number, problem: Record<string, unknown>) {
    const title = text(problem["title"]) || phrase(status);
    const detail = text(problem["detail"]);
    super(detail ? `${status} ${title}: ${detail}` : `${status} ${title}`);
    this.status = status;
    this.type = text(problem["type"]) || "about:blank";
    this.title = title;
    this.detail = detail;
    this.problem = problem;
  }
}

export class BadRequest extends ApiError {}
export class AuthenticationError extends ApiError {}
export class PermissionDenied extends ApiError {}
export class NotFoundError extends ApiError {}
export class ConflictError extends ApiError {}
export class PayloadTooLarge extends ApiError {}

export class Unprocessable extends ApiError {
  /** Every problem the server found (an invalid agent definition lists them all). */
  readonly errors: string[];

  constructor(status: number, problem: Record<string, unknown>) {
    super(status, problem);
    const found = problem["errors"];
    this.errors = Array.isArray(found) ? found.map(text) : [];
  }
}

export class RateLimited extends ApiError {}
export class ServerError extends ApiError {}

/** The server could not be reached, or the connection broke, after every retry. */
export class ConnectionFailed extends LanternError {}

/** The server answered, but not in the API's shape. */
export class InvalidResponse extends LanternError {}

/** wait() timed out; `run` is the run as last seen, still unfinished. */
export class WaitTimeout extends LanternError {
  constructor(
    readonly run: Run,
    readonly timeoutMs: number,
  ) {
    super(`run ${run.id} is still ${run.status} after ${timeoutMs} ms`);
  }
}

/** The client was called wrongly; nothing was sent. */
export class UsageError extends LanternError {}

type ApiErrorClass = new (status: number, problem: Record<string, unknown>) => ApiError;

const BY_STATUS: Record<number, ApiErrorClass> = {
  400: BadRequest,
  401: AuthenticationError,
  403: PermissionDenied,
  404: NotFoundError,
  409: ConflictError,
  413: PayloadTooLarge,
  422: Unprocessable,
  429: RateLimited,
};

/** The error for a status and its problem document. */
export function errorFor(status: number, problem: Record<string, unknown>): ApiError {
  const cls = BY_STATUS[status] ?? (status >= 500 ? ServerError : ApiError);
  return new cls(status, problem);
}

/** The error for an answer whose body may or may not be problem JSON: a body that is not
 * still maps by status, its text as the detail. */
export function errorFromBody(status: number, body: string): ApiError {
  let parsed: unknown;
  try {
    parsed = body.trim() ? JSON.parse(body) : undefined;
  } catch {
    parsed = undefined;
  }
  if (typeof parsed === "object" && parsed !== null && !Array.isArray(parsed)) {
    return errorFor(status, parsed as Record<string, unknown>);
  }
  return errorFor(status, { title: phrase(status), status, detail: body.trim() });
}

// The reason phrases of the statuses the API answers with; others read "Error".
const PHRASES: Record<number, string> = {
  400: "Bad Request",
  401: "Unauthorized",
  403: "Forbidden",
  404: "Not Found",
  405: "Method Not Allowed",
  409: "Conflict",
  413: "Content Too Large",
  422: "Unprocessable Content",
  429: "Too Many Requests",
  500: "Internal Server Error",
  502: "Bad Gateway",
  503: "Service Unavailable",
  504: "Gateway Timeout",
};

function phrase(status: number): string {
  return PHRASES[status] ?? "Error";
}

/** A problem member as text: a string as is, anything else (a list of issues...) as JSON. */
function text(value: unknown): string {
  if (value === undefined || value === null) return "";
  return typeof value === "string" ? value : JSON.stringify(value);
}
