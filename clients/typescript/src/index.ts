// @lantern-durable/client: the TypeScript client of Lantern's REST API (docs/typescript.md).
export { LanternClient } from "./client.js";
export type { CallOptions, ClientOptions, RetryInfo, StreamOptions } from "./client.js";
export {
  ApiError,
  AuthenticationError,
  BadRequest,
  ConflictError,
  ConnectionFailed,
  InvalidResponse,
  LanternError,
  NotFoundError,
  PayloadTooLarge,
  PermissionDenied,
  RateLimited,
  ServerError,
  Unprocessable,
  UsageError,
  WaitTimeout,
} from "./errors.js";
export { Backoff } from "./retry.js";
export { LiveTexts, TERMINAL_KINDS } from "./stream.js";
export type { EventItem, StreamItem, TextDelta, TextReset } from "./stream.js";
export { TERMINAL_STATUSES, isFinished } from "./types.js";
export type {
  Agent,
  DecisionRecord,
  Delivery,
  Event,
  EventPage,
  Jwk,
  Page,
  PendingApproval,
  Problem,
  Receipt,
  Run,
  RunStatus,
  Secret,
  SignalSent,
  Usage,
  Worker,
} from "./types.js";
