#!/usr/bin/env node
// Stream a run's text into the terminal as its model steps write it, with the TypeScript client
// (clients/typescript, docs/typescript.md). The text goes to stdout, each step under its name;
// the run's progress goes to stderr. A step retried after a failed attempt starts its text again;
// a dropped connection (a restarted server) is followed again without a word lost or repeated.
//
//   (cd clients/typescript && npm ci && npm run build)
//   export LANTERN_URL=http://127.0.0.1:8787 LANTERN_API_KEY=lk_...
//   node examples/typescript/stream.mjs RUN_ID
//   node examples/typescript/stream.mjs --agent NAME --input '{"text": "hello"}'
//
// Exit status: 0 when the run succeeded, 1 when it failed or was cancelled, 2 on bad usage.
import { parseArgs } from "node:util";
import { LanternClient, LanternError, LiveTexts } from "../../clients/typescript/dist/src/index.js";

const { values, positionals } = parseArgs({
  allowPositionals: true,
  options: { agent: { type: "string" }, input: { type: "string", default: "{}" } },
});
if ((positionals.length === 1) === (values.agent !== undefined)) {
  console.error("usage: stream.mjs RUN_ID | --agent NAME [--input JSON]");
  process.exit(2);
}

const lantern = new LanternClient(); // LANTERN_URL and LANTERN_API_KEY
const stop = new AbortController();
process.once("SIGINT", () => stop.abort());

try {
  const runId =
    positionals[0] ?? (await lantern.createRun(values.agent, JSON.parse(values.input))).id;
  console.error(`following ${runId}`);
  const live = new LiveTexts();
  const shown = new Map(); // what the terminal has of each step's text
  let current; // the step whose text the terminal is writing
  let status = "unknown";
  for await (const item of lantern.stream(runId, { signal: stop.signal })) {
    const stepId = live.apply(item);
    if (stepId !== null) {
      const text = live.texts.get(stepId) ?? "";
      const before = shown.get(stepId) ?? "";
      if (stepId !== current) {
        process.stdout.write(`${current === undefined ? "" : "\n"}── ${stepId} ──\n`);
        current = stepId;
      }
      if (text.startsWith(before)) {
        process.stdout.write(text.slice(before.length));
      } else {
        // A failed attempt's text was replaced: say so, then write the new text whole.
        process.stdout.write(`\n[${stepId}: retried, its text starts again]\n${text}`);
      }
      shown.set(stepId, text);
    }
    if (item.type === "event") {
      const { kind, stepId: step } = item.event;
      if (kind === "step_waiting") console.error(`\n[${step} waits: approve it to go on]`);
      if (kind.startsWith("run_")) status = kind.slice("run_".length);
    }
  }
  process.stdout.write("\n");
  console.error(`run ${runId} ${status}`);
  process.exitCode = status === "succeeded" ? 0 : 1;
} catch (error) {
  if (stop.signal.aborted) process.exit(130);
  if (!(error instanceof LanternError) && !(error instanceof SyntaxError)) throw error;
  console.error(`error: ${error.message}`);
  process.exitCode = error instanceof SyntaxError ? 2 : 1;
}
