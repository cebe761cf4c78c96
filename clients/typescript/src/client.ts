// LanternClient: the TypeScript client of Lantern's REST API, the Python SDK's surface
// (lantern/sdk/client.py) in camelCase, on nothing but the platform's fetch.
//
//   const lantern = new LanternClient({ baseUrl: "http://127.0.0.1:8787", apiKey });
//   const run = await lantern.createRun("onboard", { name: "Ada" });
//   for await (const item of lantern.stream(run.id)) { ... }
//   const done = await lantern.wait(run.id, { timeoutMs: 60_000 });
//
// Errors are the tree in errors.ts; when a request is retried is retry.ts.
import {
  ConnectionFailed,
  InvalidResponse,
  LanternError,
  UsageError,
  WaitTimeout,
  errorFromBody,
} from "./errors.js";
import { Backoff, describe, parseRetryAfter, retryNetworkError, retryStatus } from "./retry.js";
import { type StreamItem, followStream, sleep } from "./stream.js";
import {
  type Agent,
  type AgentPage,
  type ApprovalsQuery,
  type CancelAnswer,
  type CreateAnswer,
  type CreateRunBody,
  type DecisionBody,
  type DecisionRecord,
  type Delivery,
  type DeliveryList,
  type EventPage,
  type EventsQuery,
  type Event,
  type Jwk,
  type ListRunsQuery,
  type Page,
  type PendingApproval,
  type Receipt,
  type RetryAnswer,
  type ResumeAnswer,
  type ResumeBody,
  type RetryBody,
  type Run,
  type RunPage,
  type RunStatus,
  type Secret,
  type SecretPage,
  type SignalSent,
  type Worker,
  type WorkerPage,
  isFinished,
} from "./types.js";

/** The server's longest long-poll. */
const MAX_WAIT_MS = 60_000;

export interface ClientOptions {
  /** Default: the LANTERN_URL environment variable (where there is one). */
  baseUrl?: string;
  /** Default: LANTERN_API_KEY. */
  apiKey?: string;
  /** Bounds each request (a long-poll gets its wait on top). Default 30 s. */
  timeoutMs?: number;
  /** Extra attempts a retried call may make. Default 3. */
  maxRetries?: number;
  backoff?: Backoff;
  /** Another fetch (a test's, a proxy agent's); the platform's by default. */
  fetch?: typeof fetch;
  /** Told before each retry of a request, and why (a log line, a metric). */
  onRetry?: (retry: RetryInfo) => void;
}

export interface RetryInfo {
  method: string;
  path: string;
  /** 1 for the first retry. */
  retry: number;
  retries: number;
  delayMs: number;
  reason: string;
}

/** Options every call takes. */
export interface CallOptions {
  /** Aborts the call (and its retries); it rejects with the signal's reason. */
  signal?: AbortSignal;
}

export interface StreamOptions extends CallOptions {
  /** Start after this journal seq (0: from the first event). */
  after?: number;
  /** How many times in a row a dropped stream is followed again. Default 10. */
  maxReconnects?: number;
  onReconnect?: (after: number, reason: string) => void;
}

type Method = "GET" | "POST" | "PUT" | "DELETE";
type QueryValue = string | number | boolean | null | undefined;

interface Request extends CallOptions {
  /** Safe to repeat without doing anything twice (retried on any network error). */
  safe?: boolean;
  query?: Record<string, QueryValue> | undefined;
  body?: unknown;
  headers?: Record<string, string>;
  /** Added to the timeout: a long-poll's wait. */
  extraMs?: number;
  retries?: number;
}

export class LanternClient {
  readonly baseUrl: string;
  readonly timeoutMs: number;
  readonly maxRetries: number;
  readonly backoff: Backoff;
  private readonly apiKey: string;
  private readonly fetch: typeof fetch;
  private readonly onRetry: ((retry: RetryInfo) => void) | undefined;

  constructor(options: ClientOptions = {}) {
    const url = options.baseUrl ?? environment("LANTERN_URL");
    const key = options.apiKey ?? environment("LANTERN_API_KEY");
    if (!url) throw new UsageError("no Lantern server URL: pass baseUrl or set LANTERN_URL");
    if (!/^https?:\/\//.test(url)) {
      throw new UsageError(`the Lantern server URL must start with http:// or https://: ${url}`);
    }
    if (!key) throw new UsageError("no Lantern API key: pass apiKey or set LANTERN_API_KEY");
    const timeoutMs = options.timeoutMs ?? 30_000;
    const maxRetries = options.maxRetries ?? 3;
    if (!(timeoutMs > 0) || !(maxRetries >= 0) || !Number.isInteger(maxRetries)) {
      throw new UsageError("maxRetries must be an integer >= 0 and timeoutMs > 0");
    }
    this.baseUrl = url.replace(/\/+$/, "");
    this.apiKey = key;
    this.timeoutMs = timeoutMs;
    this.maxRetries = maxRetries;
    this.backoff = options.backoff ?? new Backoff();
    this.fetch = options.fetch ?? globalThis.fetch.bind(globalThis);
    this.onRetry = options.onRetry;
  }

  // Runs

  /** Start a run of the agent's newest version. The request always carries an idempotency key
   * (a random one unless given), so it is safely retried: the same key with the same body
   * gives back the same run; with another body, ConflictError. `priority` (0 to 9, default 5):
   * among queued runs that may start, a higher one starts first. With `waitMs` (up to 60 s)
   * the server answers once the run is finished, or when the wait is over with the run as it
   * is then: a short run in one request. */
  async createRun(
    agentName: string,
    input?: unknown,
    options: CallOptions & { idempotencyKey?: string; priority?: number; waitMs?: number } = {},
  ): Promise<Run> {
    const body: CreateRunBody = { agentName, input: input ?? null, priority: options.priority ?? 5 };
    const key = options.idempotencyKey ?? randomKey();
    const wait = options.waitMs === undefined ? undefined : seconds(options.waitMs);
    const run = await this.send<CreateAnswer>("POST", "/v1/runs", {
      ...options,
      safe: true,
      body,
      headers: { "Idempotency-Key": key },
      query: { wait },
      extraMs: Math.max(options.waitMs ?? 0, 0),
    });
    return checked(run, RUN_KEYS);
  }

  /** The run. With `waitMs` (up to 60 s) the server answers as soon as the run is finished, or
   * when the wait is over with the run as it is then. */
  async getRun(runId: string, options: CallOptions & { waitMs?: number } = {}): Promise<Run> {
    const wait = options.waitMs === undefined ? undefined : seconds(options.waitMs);
    const run = await this.send<Run>("GET", `/v1/runs/${seg(runId)}`, {
      ...options,
      query: { wait },
      extraMs: Math.max(options.waitMs ?? 0, 0),
    });
    return checked(run, RUN_KEYS);
  }

  /** One page of runs, newest first. */
  async listRuns(
    options: CallOptions & {
      status?: RunStatus;
      agentName?: string;
      limit?: number;
      cursor?: string;
    } = {},
  ): Promise<Page<Run>> {
    const query: ListRunsQuery = compact({
      status: options.status,
      agentName: options.agentName,
      limit: options.limit,
      cursor: options.cursor,
    });
    const page = await this.send<RunPage>("GET", "/v1/runs", { ...options, query });
    return checked(page, PAGE_KEYS);
  }

  /** Every run, newest first, page after page (`limit` is the page size). */
  async *iterRuns(options: Parameters<LanternClient["listRuns"]>[0] = {}): AsyncGenerator<Run> {
    let cursor = options.cursor;
    for (;;) {
      const page = await this.listRuns({ ...options, ...(cursor === undefined ? {} : { cursor }) });
      yield* page.items;
      if (page.nextCursor === null) return;
      cursor = page.nextCursor;
    }
  }

  /** One page of the run's journal: the events with `seq > after`, in order; `nextAfter` is
   * set while more remain (pass it back as `after`). A step output over 16 KiB is stored apart
   * and its event holds `{outputRef, outputBytes}`; with `expandOutputs` the event holds the
   * value as `output` too. */
  async events(
    runId: string,
    options: CallOptions & { after?: number; limit?: number; expandOutputs?: boolean } = {},
  ): Promise<EventPage> {
    const query: EventsQuery = compact({
      after: options.after,
      limit: options.limit,
      expand: options.expandOutputs ? ("outputs" as const) : undefined,
    });
    const page = await this.send<EventPage>("GET", `/v1/runs/${seg(runId)}/events`, {
      ...options,
      query,
    });
    return checked(page, EVENT_PAGE_KEYS);
  }

  /** The run's whole journal as it is now, page after page (`limit` is the page size). */
  async *iterEvents(
    runId: string,
    options: CallOptions & { after?: number; limit?: number; expandOutputs?: boolean } = {},
  ): AsyncGenerator<Event> {
    let after = options.after ?? 0;
    for (;;) {
      const page = await this.events(runId, { ...options, after });
      yield* page.items;
      if (page.nextAfter === null) return;
      after = page.nextAfter;
    }
  }

  /** The run as it happens (`GET /v1/runs/{id}/stream`): each journal event as it is committed,
   * and `delta`/`reset` items carrying model steps' text as it is generated, until the run's
   * terminal event. A dropped connection is followed again with `Last-Event-ID`, so no event
   * is missed or repeated; `LiveTexts` assembles the text. */
  stream(runId: string, options: StreamOptions = {}): AsyncGenerator<StreamItem> {
    const path = `/v1/runs/${seg(runId)}/stream`;
    const connect = async (lastEventId: number): Promise<Response> => {
      const headers: Record<string, string> = {
        ...this.headers(),
        Accept: "text/event-stream",
      };
      if (lastEventId > 0) headers["Last-Event-ID"] = String(lastEventId);
      // Only the connection is timed: the server pings an idle stream, a dead one is closed.
      const connecting = new AbortController();
      const timer = setTimeout(
        () => connecting.abort(new DOMException("connect timed out", "TimeoutError")),
        this.timeoutMs,
      );
      const signals = [connecting.signal, ...(options.signal ? [options.signal] : [])];
      try {
        return await this.fetch(this.baseUrl + path, {
          headers,
          signal: AbortSignal.any(signals),
        });
      } finally {
        clearTimeout(timer);
      }
    };
    return followStream(connect, `GET ${path}`, {
      after: options.after ?? 0,
      maxReconnects: options.maxReconnects ?? 10,
      backoff: this.backoff,
      signal: options.signal,
      onReconnect: options.onReconnect,
    });
  }

  /** The run once finished. With `timeoutMs`, WaitTimeout when it passes first. A run parked
   * on an approval or a signal is not finished: it waits for it. */
  async wait(runId: string, options: CallOptions & { timeoutMs?: number } = {}): Promise<Run> {
    const deadline = options.timeoutMs === undefined ? undefined : Date.now() + options.timeoutMs;
    for (;;) {
      const left = deadline === undefined ? MAX_WAIT_MS : deadline - Date.now();
      const run = await this.getRun(runId, {
        ...options,
        waitMs: Math.min(Math.max(left, 0), MAX_WAIT_MS),
      });
      if (isFinished(run)) return run;
      if (deadline !== undefined && Date.now() >= deadline) {
        throw new WaitTimeout(run, options.timeoutMs ?? 0);
      }
    }
  }

  /** Approve a run parked at an approval, a confidence gate or an anomaly's pause (named
   * `anomaly:<kind>`); the run resumes on whichever replica claims it. A second decision, or
   * one at a node that is not waiting, throws ConflictError. */
  approve(
    runId: string,
    nodeId: string,
    options: CallOptions & { comment?: string } = {},
  ): Promise<DecisionRecord> {
    return this.decide(runId, nodeId, "approve", options);
  }

  /** Reject, as `approve` approves. */
  reject(
    runId: string,
    nodeId: string,
    options: CallOptions & { comment?: string } = {},
  ): Promise<DecisionRecord> {
    return this.decide(runId, nodeId, "reject", options);
  }

  private async decide(
    runId: string,
    nodeId: string,
    decision: DecisionBody["decision"],
    options: CallOptions & { comment?: string },
  ): Promise<DecisionRecord> {
    const body: DecisionBody = { decision };
    if (options.comment !== undefined) body.comment = options.comment;
    const path = `/v1/runs/${seg(runId)}/approvals/${seg(nodeId)}`;
    const answer = await this.send<DecisionRecord>("POST", path, { ...options, body });
    return checked(answer, ["runId", "nodeId", "decision"]);
  }

  /** The approvals the workspace's runs wait on with no decision yet, oldest first. */
  async pendingApprovals(options: CallOptions & { limit?: number } = {}): Promise<PendingApproval[]> {
    const query: ApprovalsQuery = compact({ status: "pending" as const, limit: options.limit });
    const answer = await this.send<{ items: PendingApproval[] }>("GET", "/v1/approvals", {
      ...options,
      query,
    });
    return checked(answer, ["items"]).items;
  }

  /** Deliver a named signal to a run (CONTRACT §15): stored durably before the server answers,
   * taken by the run's next wait for that name. It always carries an idempotency key (a random
   * one unless given), so a retried send is one signal. A finished run throws ConflictError. */
  async signal(
    runId: string,
    name: string,
    payload?: unknown,
    options: CallOptions & { idempotencyKey?: string } = {},
  ): Promise<SignalSent> {
    const path = `/v1/runs/${seg(runId)}/signals/${seg(name)}`;
    const answer = await this.send<SignalSent>("POST", path, {
      ...options,
      safe: true,
      body: { payload: payload ?? null },
      headers: { "Idempotency-Key": options.idempotencyKey ?? randomKey() },
    });
    return checked(answer, ["id", "name", "runId"]);
  }

  /** Cancel a queued, running or waiting run. A running run may come back still running with
   * `cancelRequested` set while its replica stops it; wait() for the end. A run already
   * finished throws ConflictError. */
  async cancel(runId: string, options: CallOptions = {}): Promise<Run> {
    const path = `/v1/runs/${seg(runId)}/cancel`;
    return checked(await this.send<CancelAnswer>("POST", path, options), RUN_KEYS);
  }

  /** A new run of a failed or cancelled run's agent version that replays its completed steps
   * before `fromStep` (all of them when absent) and runs on from there. A run that succeeded
   * throws ConflictError. */
  async retry(runId: string, options: CallOptions & { fromStep?: string } = {}): Promise<Run> {
    const body: RetryBody = options.fromStep === undefined ? {} : { fromStep: options.fromStep };
    const path = `/v1/runs/${seg(runId)}/retry`;
    return checked(await this.send<RetryAnswer>("POST", path, { ...options, body }), RUN_KEYS);
  }

  /** Move a code-first run waiting for a version of its code onto `version`. */
  async resume(runId: string, version: string, options: CallOptions = {}): Promise<Run> {
    const body: ResumeBody = { version };
    const path = `/v1/runs/${seg(runId)}/resume`;
    return checked(await this.send<ResumeAnswer>("POST", path, { ...options, body }), RUN_KEYS);
  }

  /** An output stored apart from its event, by the `outputRef` the event holds: the value
   * itself. Only a reference the run's own journal holds is read (NotFoundError otherwise). */
  async blob(runId: string, ref: string, options: CallOptions = {}): Promise<unknown> {
    return await this.send<unknown>("GET", `/v1/runs/${seg(runId)}/blobs/${seg(ref)}`, options);
  }

  /** Delete a finished run whole: its journal, deliveries, receipt and the outputs no other run
   * holds (ConflictError while it is unfinished). It answers NotFoundError from then on. */
  async deleteRun(runId: string, options: CallOptions = {}): Promise<void> {
    await this.send<void>("DELETE", `/v1/runs/${seg(runId)}`, options);
  }

  /** The run's claimed deliveries and their status (`unknown`: a crash cut one off mid-send). */
  async deliveries(runId: string, options: CallOptions = {}): Promise<Delivery[]> {
    const path = `/v1/runs/${seg(runId)}/deliveries`;
    return checked(await this.send<DeliveryList>("GET", path, options), ["items"]).items;
  }

  /** A microVM run's VMs, oldest first: node, driver, state and why each ended. */
  async vms(runId: string, options: CallOptions = {}): Promise<Record<string, unknown>[]> {
    const path = `/v1/runs/${seg(runId)}/vms`;
    const answer = await this.send<{ items: Record<string, unknown>[] }>("GET", path, options);
    return checked(answer, ["items"]).items;
  }

  /** The finished run's signed receipt (ConflictError while it is unfinished). */
  async receipt(runId: string, options: CallOptions = {}): Promise<Receipt> {
    const path = `/v1/runs/${seg(runId)}/receipt`;
    return checked(await this.send<Receipt>("GET", path, options), ["receipt", "signature", "keyId"]);
  }

  /** The public keys that verify receipts, as JWKs (`kty` OKP, `crv` Ed25519). */
  async receiptKeys(options: CallOptions = {}): Promise<Jwk[]> {
    const answer = await this.send<{ keys: Jwk[] }>("GET", "/v1/receipts/keys", options);
    return checked(answer, ["keys"]).keys;
  }

  // Agents

  /** Store the definition as the agent's next version. An invalid one throws Unprocessable with
   * every problem in `errors`. */
  async applyAgent(definition: Record<string, unknown>, options: CallOptions = {}): Promise<Agent> {
    const name = definition["name"];
    if (typeof name !== "string" || !name) {
      throw new UsageError("an agent definition needs a non-empty string 'name'");
    }
    const path = `/v1/agents/${seg(name)}`;
    const agent = await this.send<Agent>("PUT", path, { ...options, body: definition });
    return checked(agent, AGENT_KEYS);
  }

  /** The agent's newest version, or the given one. */
  async getAgent(name: string, options: CallOptions & { version?: number } = {}): Promise<Agent> {
    const path = `/v1/agents/${seg(name)}`;
    const agent = await this.send<Agent>("GET", path, {
      ...options,
      query: { version: options.version },
    });
    return checked(agent, AGENT_KEYS);
  }

  /** One page of agents. */
  async listAgents(
    options: CallOptions & { limit?: number; cursor?: string } = {},
  ): Promise<Page<Agent>> {
    const page = await this.send<AgentPage>("GET", "/v1/agents", {
      ...options,
      query: { limit: options.limit, cursor: options.cursor },
    });
    return checked(page, PAGE_KEYS);
  }

  // The workspace and the server

  /** The key's workspace's secrets: names and times, never a value (scope `secrets:read`). */
  async secrets(options: CallOptions = {}): Promise<Secret[]> {
    return checked(await this.send<SecretPage>("GET", "/v1/secrets", options), ["items"]).items;
  }

  /** Set a secret of the key's workspace (scope `secrets:write`); the answer names it and its
   * times, never its value. */
  async setSecret(name: string, value: string, options: CallOptions = {}): Promise<Secret> {
    const path = `/v1/secrets/${seg(name)}`;
    const secret = await this.send<Secret>("PUT", path, { ...options, body: { value } });
    return checked(secret, ["name", "createdAt", "updatedAt"]);
  }

  /** Delete a secret of the key's workspace (scope `secrets:write`); NotFoundError when there
   * is none of that name. */
  async deleteSecret(name: string, options: CallOptions = {}): Promise<void> {
    await this.send<undefined>("DELETE", `/v1/secrets/${seg(name)}`, options);
  }

  /** The replicas sharing the server's database (scope `admin`). */
  async workers(options: CallOptions = {}): Promise<Worker[]> {
    return checked(await this.send<WorkerPage>("GET", "/v1/workers", options), ["items"]).items;
  }

  /** The runtime nodes that run microVM agents: drivers, capacity, heartbeats (an operator key). */
  async runtimeNodes(options: CallOptions = {}): Promise<Record<string, unknown>[]> {
    const answer = await this.send<{ items: Record<string, unknown>[] }>(
      "GET",
      "/v1/runtime/nodes",
      options,
    );
    return checked(answer, ["items"]).items;
  }

  /** Whether the server answers its health check now (one attempt, no retries). */
  async health(options: CallOptions = {}): Promise<boolean> {
    try {
      const answer = await this.send<{ status?: unknown }>("GET", "/healthz", {
        ...options,
        retries: 0,
      });
      return answer?.status === "ok";
    } catch (error) {
      if (error instanceof LanternError) return false; // unreachable, or not healthy
      throw error;
    }
  }

  // The one place requests are sent, retried and their errors thrown.

  private headers(): Record<string, string> {
    return { Authorization: `Bearer ${this.apiKey}`, Accept: "application/json" };
  }

  private async send<T>(method: Method, path: string, request: Request = {}): Promise<T> {
    const retries = request.retries ?? this.maxRetries;
    const safe = request.safe ?? method === "GET";
    const url = new URL(this.baseUrl + path);
    for (const [name, value] of Object.entries(request.query ?? {})) {
      if (value !== undefined && value !== null) url.searchParams.set(name, String(value));
    }
    const headers: Record<string, string> = { ...this.headers(), ...request.headers };
    let body: string | undefined;
    if (request.body !== undefined) {
      headers["Content-Type"] = "application/json";
      body = JSON.stringify(request.body);
    }
    for (let attempt = 0; ; attempt += 1) {
      const timeout = AbortSignal.timeout(this.timeoutMs + (request.extraMs ?? 0));
      const signal = request.signal ? AbortSignal.any([request.signal, timeout]) : timeout;
      let delay: number;
      let reason: string;
      try {
        const response = await this.fetch(url, { method, headers, body: body ?? null, signal });
        const text = await response.text();
        if (response.status === 204) return undefined as T; // a delete: nothing to answer
        if (response.ok) return parse<T>(text, method, path, response.status);
        if (attempt >= retries || !retryStatus(response.status, safe)) {
          throw errorFromBody(response.status, text);
        }
        delay = this.backoff.delay(attempt, parseRetryAfter(response.headers.get("Retry-After")));
        reason = `status ${response.status}`;
      } catch (error) {
        if (error instanceof LanternError || request.signal?.aborted) throw error;
        if (attempt >= retries || !retryNetworkError(error, safe)) {
          const tries = attempt > 0 ? ` (after ${attempt + 1} attempts)` : "";
          throw new ConnectionFailed(`${method} ${url.origin}${path}: ${describe(error)}${tries}`, {
            cause: error,
          });
        }
        delay = this.backoff.delay(attempt);
        reason = describe(error);
      }
      this.onRetry?.({ method, path, retry: attempt + 1, retries, delayMs: delay, reason });
      await sleep(delay, request.signal);
    }
  }
}

const RUN_KEYS = ["id", "agentName", "status", "createdAt"] as const;
const PAGE_KEYS = ["items", "nextCursor"] as const;
const EVENT_PAGE_KEYS = ["items", "nextAfter"] as const;
const AGENT_KEYS = ["name", "version", "definition"] as const;

function parse<T>(text: string, method: Method, path: string, status: number): T {
  try {
    return JSON.parse(text) as T;
  } catch (error) {
    throw new InvalidResponse(`${method} ${path}: ${status} is not JSON`, { cause: error });
  }
}

/** The answer, once it has the members the API always sends; InvalidResponse if not. */
function checked<T>(answer: T, keys: readonly string[]): T {
  if (typeof answer !== "object" || answer === null || Array.isArray(answer)) {
    throw new InvalidResponse(`unexpected answer from the server: ${JSON.stringify(answer)}`);
  }
  const missing = keys.filter((key) => !(key in answer));
  if (missing.length > 0) {
    throw new InvalidResponse(`unexpected answer from the server: no ${missing.join(", ")}`);
  }
  return answer;
}

/** The object without its undefined members, as the API's optional parameters want it. */
function compact<T extends Record<string, unknown>>(
  value: T,
): { [K in keyof T]?: Exclude<T[K], undefined> } {
  return Object.fromEntries(Object.entries(value).filter(([, v]) => v !== undefined)) as {
    [K in keyof T]?: Exclude<T[K], undefined>;
  };
}

/** One path segment, percent-encoded. */
function seg(value: string): string {
  return encodeURIComponent(value);
}

/** Milliseconds as the API's seconds: 30, 0.5. */
function seconds(ms: number): number {
  return Math.max(ms, 0) / 1000;
}

function randomKey(): string {
  return globalThis.crypto.randomUUID().replaceAll("-", "");
}

function environment(name: string): string | undefined {
  const env = (globalThis as { process?: { env?: Record<string, string | undefined> } }).process
    ?.env;
  return env?.[name] || undefined;
}
