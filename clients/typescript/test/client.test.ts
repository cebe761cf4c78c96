// The TypeScript client against a real `lantern serve` (SQLite in a temporary folder): runs
// created once per Idempotency-Key, read and listed page by page, the journal paged, the live
// stream with its text and a resume across a server SIGKILLed mid-run, approvals, cancel and
// retry, signals, and every error the server answers mapped onto the error tree. The agents are
// graphs of built-in nodes and the offline model. Large outputs read back (events with
// expandOutputs, blob) and a run deleted. A create with waitMs answers with the finished run.
import assert from "node:assert/strict";
import { execFile } from "node:child_process";
import { randomUUID } from "node:crypto";
import { join } from "node:path";
import { promisify } from "node:util";
import { after, before, describe, test } from "node:test";
import {
  ApiError,
  AuthenticationError,
  Backoff,
  ConflictError,
  ConnectionFailed,
  type Event,
  InvalidResponse,
  LanternClient,
  LanternError,
  LiveTexts,
  NotFoundError,
  PayloadTooLarge,
  PermissionDenied,
  type RetryInfo,
  ServerError,
  type StreamItem,
  Unprocessable,
  UsageError,
  WaitTimeout,
} from "../src/index.js";
import { Proxy } from "./proxy.js";
import { compileAgainst, fetchSchema, isCurrent, typesOf } from "./schema.js";
import { ROOT, Server, freePort } from "./server.js";

const TEXT = "the lamp is lit and the night is long";

function gated(name: string): Record<string, unknown> {
  // An approval first (so a follower is in place before the text), then a model step.
  return {
    name,
    graph: {
      nodes: [
        { id: "start", type: "trigger" },
        { id: "ok", type: "approval", data: { prompt: "Go?" } },
        {
          id: "draft",
          type: "ai-step",
          data: { model: "offline/echo", prompt: "{{ input.text }}" },
        },
      ],
      edges: [
        { source: "start", target: "ok" },
        { source: "ok", target: "draft" },
      ],
    },
  };
}

function story(name: string): Record<string, unknown> {
  return {
    name,
    graph: {
      nodes: [
        { id: "start", type: "trigger" },
        { id: "draft", type: "ai-step", data: { model: "offline/echo", prompt: "{{ input.text }}" } },
      ],
      edges: [{ source: "start", target: "draft" }],
    },
  };
}

function chain(name: string, steps: number): Record<string, unknown> {
  const nodes: unknown[] = [{ id: "start", type: "trigger" }];
  const edges: unknown[] = [];
  for (let i = 1; i <= steps; i += 1) {
    nodes.push({ id: `s${i}`, type: "ai-step", data: { model: "offline/echo", prompt: `step ${i}` } });
    edges.push({ source: i === 1 ? "start" : `s${i - 1}`, target: `s${i}` });
  }
  return { name, graph: { nodes, edges } };
}

/** Once the run waits for a decision at its approval. (A retried run is `waiting` from the
 * start, due at once, before it reaches the approval again: the approval is the sign.) */
async function parked(client: LanternClient, runId: string): Promise<void> {
  for (const deadline = Date.now() + 30_000; Date.now() < deadline; ) {
    const pending = await client.pendingApprovals();
    if (pending.some((a) => a.runId === runId && a.nodeId === "ok")) return;
    await new Promise((done) => setTimeout(done, 50));
  }
  throw new Error(`run ${runId} never parked at its approval`);
}

async function collect<T>(items: AsyncIterable<T>): Promise<T[]> {
  const out: T[] = [];
  for await (const item of items) out.push(item);
  return out;
}

function journal(items: StreamItem[]): Event[] {
  return items.flatMap((item) => (item.type === "event" ? [item.event] : []));
}

const server = new Server({ LANTERN_OFFLINE_WORD_DELAY: "20ms", LANTERN_MAX_BODY_BYTES: "65536" });
let client: LanternClient;
let key: string;
let readOnlyKey: string;
let adminKey: string;

// No hook or test may hang `make test`: each has two minutes at most (the script's --test-timeout).
before(async () => {
  await server.start();
  [key, readOnlyKey, adminKey] = await Promise.all([
    server.key(),
    server.key("runs:read"),
    server.key("admin,secrets:read,secrets:write,runs:read"),
  ]);
  client = new LanternClient({ baseUrl: server.url, apiKey: key });
  await Promise.all([
    client.applyAgent(gated("gated")),
    client.applyAgent(chain("chain", 3)),
    client.applyAgent(story("story")),
  ]);
}, { timeout: 120_000 });

after(async () => {
  await server.close();
});

describe("runs", () => {
  test("a create is one run per Idempotency-Key; get and list read it back, page by page", async () => {
    await client.applyAgent(gated("listed"));
    const idempotencyKey = randomUUID();
    const first = await client.createRun("listed", { text: "a" }, { idempotencyKey });
    const again = await client.createRun("listed", { text: "a" }, { idempotencyKey });
    assert.equal(again.id, first.id);
    const reused = await client
      .createRun("listed", { text: "b" }, { idempotencyKey })
      .catch((e: unknown) => e);
    assert.ok(reused instanceof ConflictError && reused instanceof ApiError);
    assert.ok(reused instanceof LanternError && reused instanceof Error);
    assert.equal(reused.status, 409);
    assert.equal(reused.name, "ConflictError");
    assert.equal(reused.problem["status"], 409);

    const got = await client.getRun(first.id);
    assert.equal(got.agentName, "listed");
    assert.deepEqual(got.input, { text: "a" });
    assert.ok(["queued", "running", "waiting"].includes(got.status));

    const second = await client.createRun("listed", { text: "c" }, { priority: 9 });
    assert.equal((await client.getRun(second.id)).priority, 9);
    assert.equal(got.priority, 5);
    const third = await client.createRun("listed", { text: "d" });
    const page = await client.listRuns({ agentName: "listed", limit: 1 });
    assert.equal(page.items.length, 1);
    assert.equal(page.items[0]?.id, third.id); // newest first
    assert.notEqual(page.nextCursor, null);
    const all = await collect(client.iterRuns({ agentName: "listed", limit: 1 }));
    assert.deepEqual(
      all.map((r) => r.id),
      [third.id, second.id, first.id],
    );
    const none = await client.listRuns({ agentName: "listed", status: "succeeded" });
    assert.deepEqual(none.items, []);
  });

  test("a create with waitMs answers with the finished run, or as it stands when the wait is over", async () => {
    const done = await client.createRun("chain", {}, { waitMs: 30_000 });
    assert.equal(done.status, "succeeded"); // one request: the create's own answer
    assert.equal((await client.getRun(done.id)).status, "succeeded");
    const started = Date.now();
    const parkedRun = await client.createRun("gated", { text: "a" }, { waitMs: 300 });
    assert.ok(["queued", "running", "waiting"].includes(parkedRun.status), parkedRun.status);
    assert.ok(Date.now() - started < 10_000);
    await client.cancel(parkedRun.id);
  });

  test("the journal comes a page at a time, each page after the last", async () => {
    const run = await client.createRun("chain", {});
    const done = await client.wait(run.id, { timeoutMs: 30_000 });
    assert.equal(done.status, "succeeded");
    const whole = await client.events(run.id);
    assert.equal(whole.nextAfter, null);
    const count = whole.items.length;
    assert.ok(count > 4, `a three-step run journals more than 4 events, got ${count}`);

    const paged: Event[] = [];
    let after = 0;
    for (;;) {
      const page = await client.events(run.id, { after, limit: 2 });
      assert.ok(page.items.length <= 2);
      paged.push(...page.items);
      if (page.nextAfter === null) break;
      assert.equal(page.nextAfter, page.items.at(-1)?.seq);
      after = page.nextAfter;
    }
    assert.deepEqual(paged, whole.items);
    assert.deepEqual(
      paged.map((e) => e.seq),
      Array.from({ length: count }, (_, i) => i + 1),
    );
    assert.equal(paged.at(-1)?.kind, "run_succeeded");
    assert.deepEqual(await collect(client.iterEvents(run.id, { limit: 3 })), whole.items);
    const past = await client.events(run.id, { after: count });
    assert.deepEqual(past, { items: [], nextAfter: null });
  });
});

describe("large outputs", () => {
  test("an output over 16 KiB reads back through events({expandOutputs}) and blob(); deleted, its run is gone", async () => {
    const big = { x: 7, page: "é".repeat(20 * 1024) }; // 40 KiB of UTF-8: stored apart
    await client.applyAgent({
      name: "big",
      graph: { nodes: [{ id: "start", type: "trigger" }], edges: [] },
    });
    const run = await client.createRun("big", big);
    assert.equal((await client.wait(run.id, { timeoutMs: 30_000 })).status, "succeeded");
    const completed = (items: Event[]): Record<string, unknown> => {
      const found = items.find((e) => e.kind === "step_completed" && e.stepId === "start");
      assert.ok(found, "the trigger step's completion is journaled");
      return found.data;
    };
    const plain = completed((await client.events(run.id)).items);
    const ref = plain["outputRef"];
    assert.equal(typeof ref, "string");
    assert.ok((plain["outputBytes"] as number) > 40 * 1024);
    assert.equal("output" in plain, false); // only the reference, unless asked
    const expanded = completed((await client.events(run.id, { expandOutputs: true })).items);
    assert.deepEqual(expanded, { ...plain, output: big });
    const paged = completed(await collect(client.iterEvents(run.id, { expandOutputs: true, limit: 2 })));
    assert.deepEqual(paged["output"], big);
    assert.deepEqual(await client.blob(run.id, ref as string), big);

    const stranger = await client.blob(run.id, `sha256:${"0".repeat(64)}`).catch((e: unknown) => e);
    assert.ok(stranger instanceof NotFoundError, String(stranger));
    const other = await client.createRun("big", { x: 1 });
    await client.wait(other.id, { timeoutMs: 30_000 });
    const borrowed = await client.blob(other.id, ref as string).catch((e: unknown) => e);
    assert.ok(borrowed instanceof NotFoundError, "a reference another run holds is not this run's");

    await client.deleteRun(run.id);
    const gone = await client.blob(run.id, ref as string).catch((e: unknown) => e);
    assert.ok(gone instanceof NotFoundError, String(gone));
    const noEvents = await client.events(run.id).catch((e: unknown) => e);
    assert.ok(noEvents instanceof NotFoundError, String(noEvents));
  });
});

describe("stream", () => {
  test("journal events and the model's text as it is generated; resume after an id", async () => {
    const run = await client.createRun("gated", { text: TEXT });
    const items: StreamItem[] = [];
    for await (const item of client.stream(run.id)) {
      items.push(item);
      if (item.type === "event" && item.event.kind === "step_waiting") {
        const decided = await client.approve(run.id, "ok", { comment: "go on" });
        assert.equal(decided.decision, "approved");
        assert.equal(decided.comment, "go on");
      }
    }
    const events = journal(items);
    assert.deepEqual(
      events.map((e) => e.seq),
      Array.from({ length: events.length }, (_, i) => i + 1),
    );
    assert.equal(events.at(-1)?.kind, "run_succeeded");
    assert.deepEqual(events, await collect(client.iterEvents(run.id)));

    // The text came word by word, before the step's completion was journaled.
    const deltas = items.filter((i) => i.type === "delta");
    assert.ok(deltas.length >= 2, `expected the text in pieces, got ${deltas.length}`);
    const completed = items.findIndex(
      (i) => i.type === "event" && i.event.kind === "step_completed" && i.event.stepId === "draft",
    );
    assert.ok(items.lastIndexOf(deltas.at(-1) as StreamItem) < completed); // live, before the end
    const fromDeltas = new LiveTexts();
    for (const delta of deltas) fromDeltas.apply(delta);
    assert.equal(fromDeltas.texts.get("draft"), TEXT);
    const live = new LiveTexts();
    for (const item of items) live.apply(item);
    assert.equal(live.texts.get("draft"), TEXT);

    // After an id: only what followed it. After the last one: nothing at all.
    const resumed = journal(await collect(client.stream(run.id, { after: 3 })));
    assert.deepEqual(
      resumed.map((e) => e.seq),
      events.slice(3).map((e) => e.seq),
    );
    assert.deepEqual(await collect(client.stream(run.id, { after: events.length })), []);

    const twice = await client.approve(run.id, "ok").catch((e: unknown) => e);
    assert.ok(twice instanceof ConflictError);
  });

  test("a stream cut by a server SIGKILLed mid-run resumes with Last-Event-ID", async () => {
    const run = await client.createRun("gated", { text: TEXT });
    const reconnects: number[] = [];
    const follower = new LanternClient({
      baseUrl: server.url,
      apiKey: key,
      backoff: new Backoff(50, 250),
    });
    const items: StreamItem[] = [];
    let waitingAt = 0;
    for await (const item of follower.stream(run.id, {
      maxReconnects: 200,
      onReconnect: (at) => reconnects.push(at),
    })) {
      items.push(item);
      if (item.type === "event" && item.event.kind === "step_waiting") {
        waitingAt = item.event.seq;
        await server.kill();
        await server.start();
        await client.approve(run.id, "ok");
      }
    }
    assert.ok(waitingAt > 0);
    assert.ok(reconnects.length >= 1 && reconnects.every((at) => at === waitingAt), `${reconnects}`);
    const events = journal(items);
    const seqs = events.map((e) => e.seq);
    assert.deepEqual(seqs, Array.from({ length: seqs.length }, (_, i) => i + 1)); // none missed or twice
    assert.equal(events.at(-1)?.kind, "run_succeeded");
    const live = new LiveTexts();
    for (const item of items) live.apply(item);
    assert.equal(live.texts.get("draft"), TEXT);
  });
});

describe("the example", () => {
  test("examples/typescript/stream.mjs starts a run and writes its text", async () => {
    const example = join(ROOT, "examples", "typescript", "stream.mjs");
    const input = JSON.stringify({ text: TEXT });
    const { stdout, stderr } = await promisify(execFile)(
      process.execPath,
      [example, "--agent", "story", "--input", input],
      { env: { ...process.env, LANTERN_URL: server.url, LANTERN_API_KEY: key } },
    );
    assert.equal(stdout, `── draft ──\n${TEXT}\n`);
    assert.match(stderr, /^run run_\w+ succeeded$/m);
  });
});

describe("decisions", () => {
  test("reject fails the run; cancel ends a waiting one; retry starts it again", async () => {
    const rejected = await client.createRun("gated", { text: "no" });
    await parked(client, rejected.id);
    const decided = await client.reject(rejected.id, "ok", { comment: "not this one" });
    assert.equal(decided.decision, "rejected");
    assert.equal(decided.comment, "not this one");
    const failed = await client.wait(rejected.id, { timeoutMs: 30_000 });
    assert.equal(failed.status, "failed");

    const waiting = await client.createRun("gated", { text: "again" });
    await parked(client, waiting.id);
    await client.cancel(waiting.id);
    const cancelled = await client.wait(waiting.id, { timeoutMs: 30_000 });
    assert.equal(cancelled.status, "cancelled");
    assert.ok((await client.cancel(waiting.id).catch((e: unknown) => e)) instanceof ConflictError);

    const retried = await client.retry(waiting.id);
    assert.notEqual(retried.id, waiting.id);
    assert.equal(retried.agentName, "gated");
    await parked(client, retried.id);
    await client.approve(retried.id, "ok");
    const done = await client.wait(retried.id, { timeoutMs: 30_000 });
    assert.equal(done.status, "succeeded");
    assert.match(JSON.stringify(done.output), /again/);
    const twice = await client.retry(done.id).catch((e: unknown) => e);
    assert.ok(twice instanceof ConflictError, String(twice));
    const fromApproval = await client.retry(rejected.id, { fromStep: "ok" });
    assert.equal(fromApproval.agentName, "gated");
    await parked(client, fromApproval.id);
  });
});

describe("signals", () => {
  test("a signal sent early is kept for the run's wait; a retried key is one signal", async () => {
    await client.applyAgent({
      name: "paid",
      graph: {
        nodes: [
          { id: "start", type: "trigger" },
          { id: "ok", type: "approval", data: { prompt: "Go?" } },
          { id: "pay", type: "signal", data: { name: "payment" } },
        ],
        edges: [
          { source: "start", target: "ok" },
          { source: "ok", target: "pay" },
        ],
      },
    });
    const run = await client.createRun("paid", {});
    await parked(client, run.id); // at its approval: the signal comes before its wait
    const idempotencyKey = randomUUID();
    const sent = await client.signal(run.id, "payment", { usd: 5 }, { idempotencyKey });
    assert.equal(sent.runId, run.id);
    assert.equal(sent.name, "payment");
    const again = await client.signal(run.id, "payment", { usd: 5 }, { idempotencyKey });
    assert.equal(again.id, sent.id);
    await client.approve(run.id, "ok");
    const done = await client.wait(run.id, { timeoutMs: 30_000 });
    assert.equal(done.status, "succeeded");
    assert.deepEqual(done.output, { received: true, payload: { usd: 5 } });
    const late = await client.signal(run.id, "payment", 1).catch((e: unknown) => e);
    assert.ok(late instanceof ConflictError, String(late));
  });
});

describe("the workspace and the server", () => {
  test("secrets are set, listed without their values and deleted; workers; a run's parts", async () => {
    const admin = new LanternClient({ baseUrl: server.url, apiKey: adminKey });
    const value = `sk-${randomUUID()}`;
    const set = await admin.setSecret("TS_TOKEN", value);
    assert.equal(set.name, "TS_TOKEN");
    const listed = await admin.secrets();
    assert.deepEqual(
      listed.map((x) => x.name),
      ["TS_TOKEN"],
    );
    assert.ok(!JSON.stringify(listed).includes(value));
    await admin.deleteSecret("TS_TOKEN");
    assert.deepEqual(await admin.secrets(), []);
    const again = await admin.deleteSecret("TS_TOKEN").catch((e: unknown) => e);
    assert.ok(again instanceof NotFoundError, String(again));
    const denied = await client.secrets().catch((e: unknown) => e); // no secrets:read
    assert.ok(denied instanceof PermissionDenied, String(denied));

    const workers = await admin.workers();
    assert.ok(workers.some((w) => w.id === `ts-test-${server.port}` && w.alive));
    const notOperator = await admin.runtimeNodes().catch((e: unknown) => e);
    assert.ok(notOperator instanceof PermissionDenied, String(notOperator)); // admin is not operator
    const operator = new LanternClient({ baseUrl: server.url, apiKey: await server.operatorKey() });
    assert.deepEqual(await operator.runtimeNodes(), []);
    const run = await client.createRun("chain", {});
    await client.wait(run.id, { timeoutMs: 30_000 });
    assert.deepEqual(await client.deliveries(run.id), []); // a graph of model steps delivers nothing
    assert.deepEqual(await client.vms(run.id), []); // nor runs in a microVM
  });
});

describe("errors", () => {
  test("problem+json answers map onto the error tree", async () => {
    const missing = await client.getRun("run_nope").catch((e: unknown) => e);
    assert.ok(missing instanceof NotFoundError, String(missing));
    assert.equal(missing.status, 404);
    assert.match(missing.type, /not-found/);
    assert.ok(missing.detail.length > 0);

    const stranger = new LanternClient({ baseUrl: server.url, apiKey: "lk_not_a_key" });
    const unknown = await stranger.listRuns().catch((e: unknown) => e);
    assert.ok(unknown instanceof AuthenticationError, String(unknown));
    assert.equal(unknown.status, 401);

    const mine = await client.createRun("gated", { text: "mine" });
    const reader = new LanternClient({ baseUrl: server.url, apiKey: readOnlyKey });
    assert.equal((await reader.getRun(mine.id)).id, mine.id);
    const scope = await reader.cancel(mine.id).catch((e: unknown) => e);
    assert.ok(scope instanceof PermissionDenied, String(scope));
    assert.equal(scope.status, 403);
    assert.notEqual((await client.getRun(mine.id)).status, "cancelled"); // it changed nothing

    const invalid = await client
      .applyAgent({ name: "broken", graph: { nodes: [{ id: "x", type: "nope" }], edges: [] } })
      .catch((e: unknown) => e);
    assert.ok(invalid instanceof Unprocessable, String(invalid));
    assert.equal(invalid.status, 422);
    assert.ok(invalid.errors.length >= 2, `${invalid.errors}`);
    assert.ok(invalid.errors.some((e) => e.includes("nope")));

    const large = await client.createRun("gated", { text: "x".repeat(100_000) }).catch((e: unknown) => e);
    assert.ok(large instanceof PayloadTooLarge, String(large));

    const timedOut = await client.wait(mine.id, { timeoutMs: 200 }).catch((e: unknown) => e);
    assert.ok(timedOut instanceof WaitTimeout, String(timedOut));
    assert.equal(timedOut.run.id, mine.id);
    assert.ok(!["succeeded", "failed", "cancelled"].includes(timedOut.run.status));

    assert.throws(() => new LanternClient({ baseUrl: "ftp://x", apiKey: "k" }), UsageError);
    assert.throws(() => new LanternClient({ baseUrl: server.url, apiKey: "" }), UsageError);
  });

  test("no server: ConnectionFailed once the retries are spent", async () => {
    const port = await freePort();
    const retries: RetryInfo[] = [];
    const nowhere = new LanternClient({
      baseUrl: `http://127.0.0.1:${port}`,
      apiKey: key,
      maxRetries: 2,
      backoff: new Backoff(1, 5),
      onRetry: (r) => retries.push(r),
    });
    // Not even an unsafe call is in doubt when the connection could not be made.
    const failed = await nowhere.cancel("run_x").catch((e: unknown) => e);
    assert.ok(failed instanceof ConnectionFailed, String(failed));
    assert.match(failed.message, /ECONNREFUSED/);
    assert.match(failed.message, /after 3 attempts/);
    assert.equal(retries.length, 2);
    assert.equal(await nowhere.health(), false);
  });
});

describe("retries through a proxy", () => {
  test("a create whose answer was lost is sent again with its key: one run", async () => {
    await client.applyAgent(gated("lost"));
    const proxy = await new Proxy(server.url, (seen, index) =>
      index === 0 && seen.method === "POST" ? "forward-then-drop" : "forward",
    ).start();
    try {
      const via = new LanternClient({ baseUrl: proxy.url, apiKey: key, backoff: new Backoff(1, 5) });
      const run = await via.createRun("lost", { text: "once" });
      const posts = proxy.seen.filter((s) => s.method === "POST");
      assert.equal(posts.length, 2);
      const keys = posts.map((s) => s.headers["idempotency-key"]);
      assert.ok(typeof keys[0] === "string" && keys[0].length > 0);
      assert.equal(keys[1], keys[0]);
      const runs = await client.listRuns({ agentName: "lost" });
      assert.deepEqual(
        runs.items.map((r) => r.id),
        [run.id],
      );
    } finally {
      await proxy.close();
    }
  });

  test("a 503 is retried for a read, after Retry-After, never for a cancel", async () => {
    const run = await client.createRun("gated", { text: "proxied" });
    const unavailable = { status: 503, headers: { "retry-after": "0" }, body: "down" };
    const html = {
      status: 200,
      headers: { "content-type": "text/html" },
      body: "<html>Sign in to the Wi-Fi</html>",
    };
    // The first read and the cancel get a 503; the last read a captive portal's page.
    const proxy = await new Proxy(server.url, (_seen, index) =>
      index === 0 || index === 2 ? unavailable : index === 3 ? html : "forward",
    ).start();
    try {
      const retries: RetryInfo[] = [];
      const via = new LanternClient({
        baseUrl: proxy.url,
        apiKey: key,
        onRetry: (r) => retries.push(r),
      });
      assert.equal((await via.getRun(run.id)).id, run.id); // 503, then the run
      assert.deepEqual(
        retries.map((r) => [r.reason, r.delayMs]),
        [["status 503", 0]],
      );
      const cancel = await via.cancel(run.id).catch((e: unknown) => e); // 503, not retried
      assert.ok(cancel instanceof ServerError, String(cancel));
      assert.equal(cancel.status, 503);
      assert.equal(cancel.detail, "down");
      assert.equal(proxy.seen.filter((s) => s.path.endsWith("/cancel")).length, 1);
      assert.notEqual((await client.getRun(run.id)).status, "cancelled");
      const portal = await via.getRun(run.id).catch((e: unknown) => e);
      assert.ok(portal instanceof InvalidResponse, String(portal));
    } finally {
      await proxy.close();
    }
  });
});

describe("types", () => {
  test("the client compiles against the served /openapi.json, with no Node types", async (t) => {
    const schema = await fetchSchema(server.url);
    const types = await typesOf(schema);
    if (!isCurrent(types)) {
      t.diagnostic("src/openapi.ts differs from the server's /openapi.json: `npm run generate`");
    }
    // The check bites: a document whose runs lost `status` fails it.
    const runs = structuredClone(schema);
    const run = runs.components?.schemas?.["RunOut"] as {
      properties: Record<string, unknown>;
      required: string[];
    };
    delete run.properties["status"];
    run.required = run.required.filter((name) => name !== "status");
    const [current, drifted] = compileAgainst(types, await typesOf(runs));
    assert.equal(current, "");
    assert.match(drifted ?? "", /Property 'status' does not exist/);
  });
});
