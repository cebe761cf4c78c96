// The run page: summary, waterfall, step details and deliveries, polled live until the run ends.

import { ApiError, isKeyProblem, pageMessage, withKey } from "./api.js";
import { duration, h, json, localTime } from "./dom.js";
import { buildModel, idempotencyKey, parseAt, provider, TERMINAL, ticks } from "./model.js";

const POLL_MS = 1000;
const page = document.getElementById("page");
const runId = page.dataset.runId;
const path = `/v1/runs/${encodeURIComponent(runId)}`;

const state = {
  get: null,
  run: null,
  events: [],
  deliveries: [],
  nodes: null, // node id -> node of the agent version the run is pinned to
  definitionProblem: null,
  selected: null,
  finished: false,
};

const STATE_LABEL = {
  completed: "completed",
  failed: "failed",
  retrying: "retried",
  "in flight": "in flight",
  cut: "in flight when its worker died",
  stopped: "stopped when the run ended",
  waiting: "waiting",
};

async function readEvents() {
  let after = state.events.length ? state.events[state.events.length - 1].seq : 0;
  let fresh = 0;
  for (;;) {
    const pageOf = await state.get(`${path}/events?after=${after}`);
    state.events.push(...pageOf.items);
    fresh += pageOf.items.length;
    if (pageOf.nextAfter === null || pageOf.nextAfter === undefined) break;
    after = pageOf.nextAfter;
  }
  return fresh;
}

async function readDefinition() {
  try {
    const name = encodeURIComponent(state.run.agentName);
    const agent = await state.get(`/v1/agents/${name}?version=${state.run.agentVersion}`);
    const nodes = (agent.definition.graph && agent.definition.graph.nodes) || [];
    state.nodes = new Map(nodes.map((n) => [n.id, n]));
  } catch (err) {
    if (!(err instanceof ApiError)) throw err;
    state.definitionProblem = err.detail;
  }
}

async function refresh() {
  const fresh = await readEvents();
  if (fresh || !state.run || !TERMINAL.has(state.run.status)) {
    [state.run, state.deliveries] = await Promise.all([
      state.get(path),
      state.get(`${path}/deliveries`).then((d) => d.items),
    ]);
  }
  state.finished = state.events.some((e) => TERMINAL.has(e.kind));
}

function sleep(ms) {
  return new Promise((resolve) => setTimeout(resolve, ms));
}

async function follow(askForKey) {
  while (!state.finished) {
    await sleep(POLL_MS);
    try {
      await refresh();
      pageMessage("");
    } catch (err) {
      if (isKeyProblem(err)) {
        askForKey(`The server stopped accepting this key: ${err.detail}.`);
        return;
      }
      pageMessage(`Lost contact with the server (${err.detail || err}); trying again…`);
    }
    render();
  }
}

withKey(async (get, askForKey) => {
  state.get = get;
  await refresh(); // the first read: a refused key surfaces here
  await readDefinition();
  render();
  follow(askForKey);
});

// -- rendering ---------------------------------------------------------------------------

function render() {
  const model = buildModel(state.events, Date.now());
  renderSummary(model);
  renderAnomalies(model);
  renderWaterfall(model);
  renderDeliveries();
  if (state.selected) renderDetails(model);
}

function renderSummary(model) {
  const run = state.run;
  const items = [
    ["Status", h("span", { class: `status ${run.status}`, id: "run-status" }, run.status)],
    ["Agent", `${run.agentName} v${run.agentVersion}`],
    ["Created", localTime(run.createdAt)],
    ["Duration", state.events.length ? duration(model.end - model.origin) : "not started"],
    ["Events", String(state.events.length)],
    ["Recoveries", String(model.bands.length)],
    ["Updates", state.finished
      ? h("span", { id: "live" }, "finished; the journal is complete")
      : h("span", { id: "live", class: "live" }, "live, every second")],
  ];
  if (run.error) items.push(["Error", h("code", {}, run.error.message || json(run.error))]);
  if (run.output !== null && run.output !== undefined) {
    items.push(["Output", h("details", {}, h("summary", {}, "show"), h("pre", {}, json(run.output)))]);
  }
  document.getElementById("summary").replaceChildren(
    ...items.flatMap(([term, value]) => [h("dt", {}, term), h("dd", {}, value)]),
  );
}

const POLICY = { record: "recorded", pause: "the run paused for a decision",
  fail: "the run failed by its policy" };

/** An anomaly_detected event {kind, detail, policy} in words. */
function anomalyText(anomaly) {
  const { kind = "anomaly", detail = {}, policy } = anomaly.data;
  const d = typeof detail === "object" && detail !== null ? detail : { detail };
  let what;
  if (kind === "runaway_loop") what = `${d.step} started ${d.started} times`;
  else if (kind === "excessive_steps") what = `${d.steps} step attempts (limit ${d.maxSteps})`;
  else if (kind === "retry_storm") {
    what = d.retries !== undefined ? `${d.retries} retries (limit ${d.maxRetries})`
      : `${d.workspaceRetriesPerMinute} retries a minute in the workspace (limit ${d.perMinute})`;
  } else if (kind === "cost_spike" || kind === "token_spike") {
    what = `${d.step}: ${d.value}, over ${d.factor}× the median ${d.median}`;
  } else {
    what = Object.entries(d).map(([k, v]) => `${k} ${JSON.stringify(v)}`).join(", ");
  }
  const policy_ = POLICY[policy] ? `; ${POLICY[policy]}` : "";
  return `${kind.replaceAll("_", " ")}: ${what}${policy_}`;
}

/** What a wait waits for: "approval", "sub-agent". */
function waitsFor(wait, s) {
  const kind = wait.kind || s.type;
  if (kind === "subagent") return "sub-agent";
  return kind || "an event";
}

function renderAnomalies(model) {
  const section = document.getElementById("anomalies");
  section.hidden = model.anomalies.length === 0;
  document.getElementById("anomaly-list").replaceChildren(
    ...model.anomalies.map((a) => h("li", {},
      h("span", { class: "flag" }, "⚠ anomaly"), " ",
      a.stepId ? ["at step ", h("strong", {}, a.stepId)] : "in the run", `: ${anomalyText(a)} `,
      h("span", { class: "muted" }, `(event ${a.seq}, +${duration(a.at - model.origin)})`))),
  );
}

function place(model, start, end) {
  const span = Math.max(model.end - model.origin, 1);
  const left = ((start - model.origin) / span) * 100;
  const width = ((Math.max(end, start) - start) / span) * 100;
  return { left: `${left.toFixed(3)}%`, width: `${width.toFixed(3)}%` };
}

function segmentTitle(s, attempt, seg) {
  const what = seg.rerun && seg.state !== "cut" ? `re-run, same key: ${STATE_LABEL[seg.state]}`
    : STATE_LABEL[seg.state];
  return `${s.id}, attempt ${attempt.attempt}: ${what}, ${duration(seg.end - seg.start)}`;
}

function stepRow(model, s) {
  const node = state.nodes && state.nodes.get(s.id);
  const bars = [];
  for (const attempt of s.attempts) {
    for (const seg of attempt.segments) {
      const label = seg.state === "cut" ? "cut off by the crash" : seg.rerun ? "re-run, same key"
        : s.attempts.length > 1 ? `attempt ${attempt.attempt}` : "";
      bars.push(h("div", {
        class: `bar attempt ${seg.state.replace(" ", "-")}${seg.rerun ? " rerun" : ""}`,
        "data-attempt": attempt.attempt, "data-state": seg.state,
        title: segmentTitle(s, attempt, seg), style: place(model, seg.start, seg.end),
      }, label));
    }
  }
  for (const b of s.backoffs) {
    const retry = b.retry || {};
    const of = retry.of ? ` of ${retry.of}` : "";
    bars.push(h("div", {
      class: "bar backoff", style: place(model, b.start, b.end),
      title: `${s.id}: backoff ${duration(b.end - b.start)} before attempt ${retry.attempt ?? "?"}${of}`,
    }, "backoff"));
  }
  for (const w of s.waits) {
    const what = waitsFor(w, s);
    bars.push(h("div", {
      class: `bar wait${w.open ? " open" : ""}`, style: place(model, w.start, w.end),
      "data-kind": w.kind, title: `${s.id}: waiting for ${what}, ${duration(w.end - w.start)}` +
        (w.open ? " so far" : ""),
    }, h("span", {}, `waiting for ${what}`)));
  }
  for (const band of s.replayed) {
    bars.push(h("div", {
      class: "marker replay", style: { left: place(model, band.end, band.end).left },
      title: `${s.id}: served from the journal on the re-drive (event ${band.seq}); not run again`,
    }, "↺"));
  }
  for (const a of s.anomalies) {
    bars.push(h("div", {
      class: "marker anomaly", style: { left: place(model, a.at, a.at).left },
      title: `anomaly: ${anomalyText(a)}`,
    }, "⚠"));
  }
  const first = s.attempts.length ? s.attempts[0].start : model.origin;
  const lastEnd = s.attempts.length ? Math.max(...s.attempts.map((a) => a.end ?? model.end)) : first;
  const badges = [
    s.replayed.length ? h("span", { class: "badge replayed" }, "replayed") : null,
    s.rerun ? h("span", { class: "badge rerun" }, "re-run, same key") : null,
    s.attempts.length > 1 ? h("span", { class: "badge attempts" }, `${s.attempts.length} attempts`) : null,
    provider(s, node) === "offline" ? h("span", { class: "badge offline" }, "offline") : null,
    s.anomalies.length ? h("span", { class: "badge anomaly" }, "⚠ anomaly") : null,
  ];
  const selected = state.selected === s.id;
  return h("div", {
    class: `row${s.replayed.length ? " replayed" : ""}${selected ? " selected" : ""}`,
    role: "button", tabindex: 0, "data-step": s.id, "aria-pressed": selected ? "true" : "false",
    onclick: () => select(s.id), onkeydown: (ev) => {
      if (ev.key === "Enter" || ev.key === " ") { ev.preventDefault(); select(s.id); }
    },
  },
  h("div", { class: "label" },
    h("div", { class: "name" }, h("strong", {}, s.id), " ", h("span", { class: "type" }, s.type)),
    h("div", { class: "facts" },
      h("span", { class: `status ${s.status.replace(" ", "-")}` }, STATE_LABEL[s.status] || s.status),
      h("span", { class: "muted" }, ` +${duration(first - model.origin)} · ${duration(lastEnd - first)}`)),
    h("div", { class: "badges" }, badges)),
  h("div", { class: "track" }, bars));
}

function renderWaterfall(model) {
  const root = document.getElementById("waterfall");
  if (!state.events.length) {
    root.replaceChildren(h("p", { class: "muted" }, "The run is queued; no step has started yet."));
    return;
  }
  const span = model.end - model.origin;
  const axis = h("div", { class: "axis" }, ticks(span).map((t) =>
    h("span", { class: "tick", style: { left: `${((t / Math.max(span, 1)) * 100).toFixed(3)}%` } },
      duration(t))));
  const bands = model.bands.map((b) => h("div", {
    class: "band crash", style: place(model, b.start, b.end),
    title: `crash: ${b.from || "?"} stopped journaling; ${b.to || "?"} recovered the run ` +
      `(epoch ${b.epoch}, event ${b.seq}) after ${duration(b.end - b.start)}`,
  }, h("span", {}, `crash → recovered by ${b.to || "?"}`)));
  // An anomaly is a run's event: a line across every row at the moment it was raised.
  const lines = model.anomalies.map((a) => h("div", {
    class: "anomaly-line", style: { left: place(model, a.at, a.at).left },
    title: `anomaly: ${anomalyText(a)}`,
  }, h("span", {}, "⚠")));
  root.replaceChildren(
    h("div", { class: "head" }, h("div", { class: "label" }, "Step"), axis),
    h("div", { class: "rows" },
      h("div", { class: "bands" }, bands, lines),
      model.steps.map((s) => stepRow(model, s))),
  );
}

function renderDeliveries() {
  const section = document.getElementById("deliveries");
  section.hidden = state.deliveries.length === 0;
  document.getElementById("deliveries-body").replaceChildren(...state.deliveries.map((d) =>
    h("tr", {}, h("td", {}, d.name), h("td", {}, d.stepId), h("td", {}, String(d.attempt)),
      h("td", {}, d.kind), h("td", {}, d.target || ""),
      h("td", { class: `status ${d.status}` },
        d.status === "unknown" ? "unknown (cut off by a crash)" : d.status))));
}

// -- details of one step -------------------------------------------------------------------

let detailsFor = null; // what the details panel shows now, to redraw only on change

function select(stepId) {
  state.selected = state.selected === stepId ? null : stepId;
  detailsFor = null;
  render();
  if (!state.selected) document.getElementById("details").hidden = true;
}

async function renderDetails(model) {
  const s = model.steps.find((x) => x.id === state.selected);
  const panel = document.getElementById("details");
  if (!s) return;
  const signature = `${s.id}:${s.events.length}:${state.deliveries.length}`;
  if (signature === detailsFor) return;
  detailsFor = signature;
  const node = state.nodes && state.nodes.get(s.id);
  const keys = await Promise.all(s.attempts.map(async (a) =>
    [a.attempt, await idempotencyKey(runId, s.id, a.attempt)]));
  const notes = [];
  for (const band of s.replayed) {
    notes.push(`Replayed: when ${band.to || "a worker"} re-drove the run (event ${band.seq}), ` +
      "this step's output was served from the journal; the step was not run again.");
  }
  if (s.rerun) {
    notes.push("Re-run, same key: this step was in flight when its worker crashed, so it ran " +
      "again with the same attempt number and therefore the same idempotency key.");
  }
  for (const r of s.retries) {
    // step_retrying names the attempt about to run; the one before it failed.
    const failedAttempt = r.attempt ? `Attempt ${r.attempt - 1}` : "An attempt";
    const why = r.error ? (r.error.message || json(r.error)) : "an error";
    const wait = r.delayMs !== undefined ? ` after a backoff of ${duration(r.delayMs)}` : "";
    notes.push(`Retried: ${failedAttempt} failed (${why}); attempt ${r.attempt ?? "?"}` +
      `${r.of ? ` of ${r.of}` : ""} followed${wait}.`);
  }
  const waited = [];
  for (const w of s.waits) {
    const d = w.data || {};
    const prompt = d.prompt ? `: “${d.prompt}”` : "";
    const child = d.childRunId
      ? [" (child run ", h("a", { href: `/ui/runs/${encodeURIComponent(d.childRunId)}` },
        d.childRunId), ")"]
      : [];
    const r = w.resumed;
    let outcome = "; still waiting";
    if (r && r.decision) {
      outcome = `; ${r.decision} by ${r.by || "someone"}${r.comment ? ` (“${r.comment}”)` : ""}`;
    } else if (r && r.status) outcome = `; the child run ${r.status}`;
    else if (r) outcome = "; resumed";
    waited.push(h("li", {}, `Waited ${duration(w.end - w.start)} for ${waitsFor(w, s)}${prompt}`,
      ...child, `${outcome}.`));
  }
  const who = provider(s, node);
  if (who === "offline") notes.push("Made by the offline model provider (no network, no key).");

  const definition = node
    ? [h("p", { class: "muted" }, "The rendered input is not journaled; this is the node's " +
        "definition, templates included, from the agent version the run is pinned to."),
      h("pre", { id: "step-definition" }, json(node))]
    : [h("p", { class: "muted" }, state.definitionProblem
      ? `The definition could not be read (${state.definitionProblem}); a key with the ` +
        "agents:read scope shows it. The step's events are below."
      : "No definition for this step.")];
  let output;
  if (s.outputRef) {
    output = h("p", {}, `Stored apart from the event (${s.outputRef.bytes} bytes, ${s.outputRef.ref}).`);
  } else if (s.output !== undefined) {
    output = h("pre", { id: "step-output" }, json(s.output));
  } else {
    output = h("p", { class: "muted" }, "No output yet.");
  }
  const stepDeliveries = state.deliveries.filter((d) => d.stepId === s.id);
  panel.replaceChildren(...[
    h("h2", {}, `Step ${s.id} `, h("span", { class: "type" }, s.type)),
    h("p", {}, h("span", { class: `status ${s.status.replace(" ", "-")}` },
      STATE_LABEL[s.status] || s.status), ` · ${s.attempts.length} attempt` +
      `${s.attempts.length === 1 ? "" : "s"}`),
    notes.length || waited.length
      ? h("ul", { class: "notes" }, notes.map((n) => h("li", {}, n)), waited) : null,
    h("h3", {}, "Input (definition)"), ...definition,
    h("h3", {}, "Output"), output,
    s.error ? [h("h3", {}, "Error"), h("pre", { class: "error" }, json(s.error))] : null,
    h("h3", {}, "Idempotency key"),
    h("p", { class: "muted" }, 'sha256("runID|stepID|attempt"), carried by every side effect of the attempt.'),
    h("table", { class: "keys" }, keys.map(([attempt, key]) => h("tr", {},
      h("th", {}, `attempt ${attempt}`), h("td", { class: "mono", "data-attempt": attempt }, key)))),
    stepDeliveries.length ? [h("h3", {}, "Deliveries"), h("ul", {}, stepDeliveries.map((d) =>
      h("li", {}, `${d.name} (${d.kind}${d.target ? ` to ${d.target}` : ""}): ` +
        (d.status === "unknown" ? "unknown (cut off by a crash)" : d.status))))] : null,
    h("h3", {}, "Events"),
    h("table", { class: "events" },
      h("thead", {}, h("tr", {}, ["Event", "At", "Kind", "Attempt", "Data"].map((c) => h("th", {}, c)))),
      h("tbody", {}, s.events.map((e) => h("tr", {},
        h("td", {}, String(e.seq)),
        h("td", { title: localTime(e.at) }, `+${duration(parseAt(e.at) - model.origin)}`),
        h("td", {}, e.kind),
        h("td", {}, e.attempt ?? ""), h("td", {}, h("code", {}, JSON.stringify(e.data)))))),
    ),
  ].flat().filter(Boolean));
  panel.hidden = false;
}
