// The stream's parsing and text assembly, without a server: Server-Sent Events bodies cut at
// every byte (a CR apart from its LF, a character apart from its other bytes), the follow-again
// rule, and LiveTexts across a retried attempt. client.test.ts follows a real server.
import assert from "node:assert/strict";
import { describe, test } from "node:test";
import { Backoff, InvalidResponse, LiveTexts, type StreamItem } from "../src/index.js";
import { followStream } from "../src/stream.js";

function event(seq: number, kind: string, data: Record<string, unknown> = {}): string {
  const body = { seq, runId: "run_1", stepId: null, nodeId: null, kind, attempt: null, data, at: "" };
  return JSON.stringify(body);
}

/** A response whose body arrives in pieces of `size` bytes. */
function answer(text: string, size: number): Response {
  const bytes = new TextEncoder().encode(text);
  let at = 0;
  const body = new ReadableStream<Uint8Array>({
    pull(controller) {
      if (at >= bytes.length) {
        controller.close();
        return;
      }
      controller.enqueue(bytes.slice(at, at + size));
      at += size;
    },
  });
  return new Response(body, { headers: { "content-type": "text/event-stream" } });
}

async function follow(
  bodies: (string | Response)[],
  asked: number[] = [],
): Promise<StreamItem[]> {
  const items: StreamItem[] = [];
  const connect = async (after: number): Promise<Response> => {
    asked.push(after);
    const next = bodies.shift();
    if (next === undefined) throw new Error("connected once too often");
    return typeof next === "string" ? answer(next, 1_000_000) : next;
  };
  const options = { after: 0, maxReconnects: 3, backoff: new Backoff(1, 1) };
  for await (const item of followStream(connect, "GET /stream", options)) items.push(item);
  return items;
}

describe("frames", () => {
  const moon = "the moon 🌙 rose";
  const body = [
    ": ping\r\n\r\n",
    `event: journal\r\nid: 1\r\ndata: ${event(1, "run_started")}\r\n\r\n`,
    `event: delta\ndata: {"stepId": "draft", "attempt": 1, "text": "${moon}", "offset": 0}\n\n`,
    'event: a-kind-from-a-newer-server\ndata: {"x": 1}\n\n',
    `event: journal\rid: 2\rdata: ${event(2, "run_succeeded")}\r\r`,
  ].join("");

  test("a body cut at any byte gives the same items", async () => {
    for (const size of [1, 2, 3, 5, 7, 64, body.length]) {
      const items = await follow([answer(body, size)]);
      assert.deepEqual(
        items.map((i) => (i.type === "event" ? i.event.kind : i.type)),
        ["run_started", "delta", "run_succeeded"],
        `cut every ${size} bytes`,
      );
      const delta = items[1];
      assert.equal(delta?.type === "delta" && delta.text, moon);
    }
  });

  test("a stream that ends before the run does is followed again after its last event", async () => {
    const asked: number[] = [];
    const first = `event: journal\nid: 1\ndata: ${event(1, "run_started")}\n\n`;
    const second = `event: journal\nid: 2\ndata: ${event(2, "run_cancelled")}\n\n`;
    const items = await follow([first, second], asked);
    assert.deepEqual(asked, [0, 1]);
    assert.deepEqual(
      items.map((i) => i.type === "event" && i.event.seq),
      [1, 2],
    );
  });

  test("a frame that is not the API's is an InvalidResponse", async () => {
    const bad = "event: delta\ndata: {\"stepId\": 3}\n\n";
    await assert.rejects(follow([bad]), InvalidResponse);
    await assert.rejects(follow(["event: journal\ndata: not json\n\n"]), InvalidResponse);
  });
});

describe("LiveTexts", () => {
  const delta = (attempt: number, text: string, offset: number): StreamItem => ({
    type: "delta",
    stepId: "draft",
    attempt,
    text,
    offset,
  });

  test("a retried attempt's text replaces the failed one's, shown once", () => {
    const live = new LiveTexts();
    live.apply(delta(1, "The first", 0));
    live.apply(delta(1, " try", 9));
    assert.equal(live.texts.get("draft"), "The first try");
    assert.equal(live.apply({ type: "reset", stepId: "draft", attempt: 2, replaces: 1 }), "draft");
    assert.equal(live.texts.get("draft"), "");
    assert.equal(live.apply(delta(1, " late", 13)), null); // the failed attempt's last piece
    live.apply(delta(2, "Second", 0));
    live.apply(delta(2, "ond go", 3)); // sent again after a reconnect: offsets keep it once
    assert.equal(live.texts.get("draft"), "Second go");
  });

  test("a model step's completion is the final word", () => {
    const live = new LiveTexts();
    live.apply(delta(1, "Half", 0));
    const completed = JSON.parse(
      event(5, "step_completed", { output: { text: "Whole", model: "offline/echo" } }),
    );
    assert.equal(live.apply({ type: "event", event: { ...completed, stepId: "draft" } }), "draft");
    assert.equal(live.texts.get("draft"), "Whole");
  });
});
