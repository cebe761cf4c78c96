// Following a run over `GET /v1/runs/{id}/stream` (Server-Sent Events), reconnecting; the
// Python SDK's lantern/sdk/stream.py. `client.stream(runId)` yields, in order:
//
// - {type: "event"}: a journal event as it is committed (what `events()` returns);
// - {type: "delta"}: a piece of a model step's answer as it is generated (never journaled);
// - {type: "reset"}: the step's text so far was a failed attempt's: drop it.
//
// When the connection drops (a replica killed, a proxy timing out) it reconnects with
// `Last-Event-ID` set to the last journal event it yielded, so no event is missed or repeated;
// it ends after the run's terminal event. `LiveTexts` applies the deltas and resets, so a
// client shows each step's text once, however many reconnects and retries there were.
import { ConnectionFailed, InvalidResponse, errorFromBody } from "./errors.js";
import { type Backoff, describe } from "./retry.js";
import type { Event } from "./types.js";

export const TERMINAL_KINDS: ReadonlySet<string> = new Set([
  "run_succeeded",
  "run_failed",
  "run_cancelled",
]);

export interface EventItem {
  type: "event";
  event: Event;
}

/** `text` goes at `offset` of the step attempt's text (see LiveTexts). */
export interface TextDelta {
  type: "delta";
  stepId: string;
  attempt: number;
  text: string;
  offset: number;
}

/** The step's text so far belonged to attempt `replaces`, which failed: `attempt`'s replaces it. */
export interface TextReset {
  type: "reset";
  stepId: string;
  attempt: number;
  replaces: number;
}

export type StreamItem = EventItem | TextDelta | TextReset;

/** Each step's text as the stream builds it: feed it every item, read `texts`. */
export class LiveTexts {
  readonly texts = new Map<string, string>();
  private readonly attempts = new Map<string, number>();

  /** Take in one item; the step whose text changed, if one did. */
  apply(item: StreamItem): string | null {
    if (item.type === "reset") {
      if (item.attempt >= (this.attempts.get(item.stepId) ?? 0)) {
        this.attempts.set(item.stepId, item.attempt);
        this.texts.set(item.stepId, "");
        return item.stepId;
      }
      return null;
    }
    if (item.type === "delta") {
      const shown = this.attempts.get(item.stepId) ?? 0;
      if (item.attempt < shown) return null; // a late piece of a replaced attempt
      const text = item.attempt > shown ? "" : (this.texts.get(item.stepId) ?? "");
      this.attempts.set(item.stepId, item.attempt);
      this.texts.set(item.stepId, text.slice(0, item.offset) + item.text);
      return item.stepId;
    }
    const { event } = item;
    if (event.kind === "step_completed" && event.stepId !== null) {
      const output = event.data["output"];
      // A model step's output (text, model, provider, usage): the journal's word is final, and
      // a follower on a replica that had no live text gets it here.
      if (isRecord(output) && typeof output["text"] === "string" && "model" in output) {
        this.texts.set(event.stepId, output["text"]);
        return event.stepId;
      }
    }
    return null;
  }
}

interface Frame {
  event: string;
  data: string;
}

/** The lines of a body, split on CR, LF or CRLF as the SSE format allows. */
async function* lines(body: ReadableStream<Uint8Array>): AsyncGenerator<string> {
  const decoder = new TextDecoder();
  const reader = body.getReader();
  let buffer = "";
  let finished = false;
  try {
    for (;;) {
      const { done, value } = await reader.read();
      finished = done;
      buffer += done ? decoder.decode() : decoder.decode(value, { stream: true });
      for (;;) {
        const end = buffer.search(/\r\n|\r|\n/);
        // A CR last in the buffer may be half of a CRLF: wait for the next chunk.
        if (end < 0 || (end === buffer.length - 1 && buffer[end] === "\r" && !done)) break;
        const width = buffer.startsWith("\r\n", end) ? 2 : 1;
        yield buffer.slice(0, end);
        buffer = buffer.slice(end + width);
      }
      if (done) return;
    }
  } finally {
    // A follower that stops early closes the connection: the server would stream on to no one.
    if (!finished) await reader.cancel().catch(() => undefined);
    reader.releaseLock();
  }
}

/** SSE frames from a body (the WHATWG parsing rules Lantern's server needs). */
async function* frames(body: ReadableStream<Uint8Array>): AsyncGenerator<Frame> {
  let event = "message";
  let data: string[] = [];
  for await (const line of lines(body)) {
    if (line === "") {
      if (data.length > 0) yield { event, data: data.join("\n") };
      event = "message";
      data = [];
      continue;
    }
    if (line.startsWith(":")) continue; // a comment: the server's keep-alive ping
    const colon = line.indexOf(":");
    const name = colon < 0 ? line : line.slice(0, colon);
    let value = colon < 0 ? "" : line.slice(colon + 1);
    if (value.startsWith(" ")) value = value.slice(1);
    if (name === "event") event = value;
    else if (name === "data") data.push(value);
  }
}

function itemOf(frame: Frame): StreamItem | null {
  if (!["journal", "delta", "reset"].includes(frame.event)) {
    return null; // a frame kind this client does not know: newer servers may send more
  }
  let body: unknown;
  try {
    body = JSON.parse(frame.data);
  } catch (error) {
    throw new InvalidResponse(`unexpected ${frame.event} frame from the server: ${frame.data}`, {
      cause: error,
    });
  }
  const bad = (): never => {
    throw new InvalidResponse(`unexpected ${frame.event} frame from the server: ${frame.data}`);
  };
  if (!isRecord(body)) return bad();
  if (frame.event === "journal") {
    if (typeof body["seq"] !== "number" || typeof body["kind"] !== "string") return bad();
    return { type: "event", event: body as unknown as Event };
  }
  const { stepId, attempt } = body;
  if (typeof stepId !== "string" || typeof attempt !== "number") return bad();
  if (frame.event === "delta") {
    const { text, offset } = body;
    if (typeof text !== "string" || typeof offset !== "number") return bad();
    return { type: "delta", stepId, attempt, text, offset };
  }
  const { replaces } = body;
  if (typeof replaces !== "number") return bad();
  return { type: "reset", stepId, attempt, replaces };
}

/** Opens the stream once: the response, its headers read (`lastEventId` 0 for none). */
export type Connect = (lastEventId: number) => Promise<Response>;

export interface FollowOptions {
  after: number;
  maxReconnects: number;
  backoff: Backoff;
  signal?: AbortSignal | undefined;
  /** Told each time the stream is followed again, and why. */
  onReconnect?: ((after: number, reason: string) => void) | undefined;
}

/** The items of the run's stream after seq `after`, across reconnects. */
export async function* followStream(
  connect: Connect,
  what: string,
  options: FollowOptions,
): AsyncGenerator<StreamItem> {
  let { after } = options;
  let failures = 0;
  for (;;) {
    let reason: string;
    try {
      const response = await connect(after);
      if (response.status === 204) return; // the run had finished and we had seen its last event
      if (!response.ok) throw errorFromBody(response.status, await response.text());
      if (response.body === null) throw new InvalidResponse(`${what}: an answer with no body`);
      for await (const frame of frames(response.body)) {
        const item = itemOf(frame);
        if (item === null) continue;
        failures = 0;
        yield item;
        if (item.type === "event") {
          after = item.event.seq;
          if (TERMINAL_KINDS.has(item.event.kind)) return;
        }
      }
      reason = "the stream ended before the run did";
    } catch (error) {
      if (options.signal?.aborted || error instanceof InvalidResponse) throw error;
      if (!isNetworkError(error)) throw error; // an ApiError: reconnecting would not help
      reason = describe(error);
    }
    if (failures >= options.maxReconnects) {
      throw new ConnectionFailed(`${what}: ${reason} (after ${failures + 1} attempts)`);
    }
    const delay = options.backoff.delay(failures);
    failures += 1;
    options.onReconnect?.(after, reason);
    await sleep(delay, options.signal);
  }
}

/** A failure of the connection itself (fetch's TypeError, a body cut off, a connect timeout). */
export function isNetworkError(error: unknown): boolean {
  if (error instanceof TypeError) return true; // fetch failed, or the body was terminated
  return error instanceof Error && (error.name === "TimeoutError" || "code" in error);
}

export function sleep(ms: number, signal?: AbortSignal): Promise<void> {
  return new Promise((done, fail) => {
    if (signal?.aborted) {
      fail(signal.reason);
      return;
    }
    const timer = setTimeout(() => {
      signal?.removeEventListener("abort", stop);
      done();
    }, ms);
    const stop = (): void => {
      clearTimeout(timer);
      fail(signal?.reason);
    };
    signal?.addEventListener("abort", stop, { once: true });
  });
}

function isRecord(value: unknown): value is Record<string, unknown> {
  return typeof value === "object" && value !== null && !Array.isArray(value);
}
