// The run page: summary, waterfall, step details and deliveries, following the run's stream
// (GET /v1/runs/{id}/stream) until it ends, with a model step's text growing as it is written.

import { ApiError, isKeyProblem, pageMessage, withKey } from "./api.js";
import { stepDetails } from "./details.js";
import { duration, h, json, localTime } from "./dom.js";
import { buildModel, provider, TERMINAL, ticks } from "./model.js";
import { renderActions, whoAmI } from "./actions.js";
import { followStream, LiveTexts } from "./stream.js";
import { anomalyText, decidedBy, STATE_LABEL, waitsFor } from "./words.js";

const RUN_READ_MS = 500; // the run and its deliveries are read again at most this often
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
  gone: false, // the run answered 404: deleted, or never was
  live: new LiveTexts(), // model steps' text as it is generated (never journaled)
  me: null, // the key: its scopes decide which actions show
  decided: new Set(), // approvals decided from this page, until the journal says so
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

/** A 404: the run was deleted (retention, or DELETE /v1/runs/{id}) or never was. The page
 * says so once and stops reading, instead of retrying as for a server away. */
function isGone(err) {
  return err instanceof ApiError && err.status === 404;
}

function sayGone(err) {
  state.gone = true;
  // Nothing of the run is left to show: only the way back, its id and the reason stay.
  for (const part of page.children) {
    if (!part.matches(".crumbs, h1, #page-message")) part.hidden = true;
  }
  pageMessage(`This run is gone (404: ${err.detail}). A finished run is deleted once past its ` +
    "workspace's retention or by DELETE /v1/runs/{id}; an export taken before still verifies.");
}

let drawing = null; // a render is due: frames that arrive together are drawn once
let reading = null; // a read of the run and its deliveries is due

function draw() {
  if (!drawing) drawing = setTimeout(() => { drawing = null; render(); }, 50);
}

function readRun() {
  if (reading || state.gone) return;
  reading = setTimeout(async () => {
    try {
      [state.run, state.deliveries] = await Promise.all([
        state.get(path),
        state.get(`${path}/deliveries`).then((d) => d.items),
      ]);
      pageMessage("");
    } catch (err) {
      if (isGone(err)) {
        sayGone(err);
        return;
      }
      pageMessage(`Lost contact with the server (${err.detail || err}); trying again…`);
    }
    reading = null;
    draw();
  }, state.finished ? 0 : RUN_READ_MS);
}

function onFrame(frame) {
  if (frame.event === "journal") {
    const last = state.events.length ? state.events[state.events.length - 1].seq : 0;
    if (frame.data.seq <= last) return;
    state.events.push(frame.data);
    state.finished = TERMINAL.has(frame.data.kind);
    readRun();
    draw();
    pageMessage("");
  } else if (frame.event === "delta" || frame.event === "reset") {
    const step = state.live.apply(frame);
    if (step) showLiveText(step);
  }
}

async function follow(askForKey) {
  const after = state.events.length ? state.events[state.events.length - 1].seq : 0;
  let stop = false;
  // Bars of steps in flight grow with the clock between frames.
  const clock = setInterval(() => { if (!state.finished) draw(); }, 1000);
  await followStream(state.get.open, path, after, onFrame, (err) => {
    if (isKeyProblem(err)) {
      stop = true;
      askForKey(`The server stopped accepting this key: ${err.detail}.`);
      throw err; // ends the stream's loop
    }
    if (isGone(err)) {
      stop = true;
      sayGone(err);
      throw err;
    }
    pageMessage(`Lost contact with the server (${err.detail || err}); trying again…`);
  }).catch((err) => { if (!stop) pageMessage(String(err)); });
  clearInterval(clock);
  if (!state.finished) return;
  readRun();
}

withKey(async (get, askForKey) => {
  state.get = get;
  try {
    await refresh(); // the first read: a refused key surfaces here
  } catch (err) {
    if (!isGone(err)) throw err;
    sayGone(err);
    return;
  }
  state.me = await whoAmI(get);
  await readDefinition();
  render();
  follow(askForKey);
});

// -- rendering ---------------------------------------------------------------------------

function render() {
  const model = buildModel(state.events, Date.now());
  renderSummary(model);
  renderActions({ get: state.get, me: state.me, run: state.run, model, finished: state.finished,
    // An action's effect is a commit, which wakes the page's wait for the next one.
    decided: state.decided, onAction: () => {} });
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
      : h("span", { id: "live", class: "live" }, "live, as each event is committed")],
  ];
  const link = (id) => h("a", { href: `/ui/runs/${encodeURIComponent(id)}`, class: "mono" }, id);
  if (run.parentRunId) items.push(["Parent run", link(run.parentRunId)]);
  if (run.children && run.children.length) {
    items.push(["Sub-agent runs", h("span", { id: "children" },
      run.children.flatMap((id, i) => (i ? [", ", link(id)] : [link(id)])))]);
  }
  if (run.error) items.push(["Error", h("code", {}, run.error.message || json(run.error))]);
  if (run.output !== null && run.output !== undefined) {
    items.push(["Output", h("details", {}, h("summary", {}, "show"), h("pre", {}, json(run.output)))]);
  }
  document.getElementById("summary").replaceChildren(
    ...items.flatMap(([term, value]) => [h("dt", {}, term), h("dd", {}, value)]),
  );
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
    const decision = w.resumed && w.resumed.decision
      ? `${w.resumed.decision} by ${decidedBy(w.resumed)}` : null;
    bars.push(h("div", {
      class: `bar wait${w.open ? " open" : ""}`, style: place(model, w.start, w.end),
      "data-kind": w.kind, title: `${s.id}: waiting for ${what}, ${duration(w.end - w.start)}` +
        (w.open ? " so far" : "") + (decision ? `; ${decision}` : ""),
    }, h("span", {}, decision || `waiting for ${what}`)));
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
    s.replayed.length || s.copiedFrom ? h("span", { class: "badge replayed" },
      s.copiedFrom ? "replayed from the retried run" : "replayed") : null,
    s.rerun ? h("span", { class: "badge rerun" }, "re-run, same key") : null,
    s.attempts.length > 1 ? h("span", { class: "badge attempts" }, `${s.attempts.length} attempts`) : null,
    provider(s, node) === "offline" ? h("span", { class: "badge offline" }, "offline") : null,
    s.anomalies.length ? h("span", { class: "badge anomaly" }, "⚠ anomaly") : null,
  ];
  const selected = state.selected === s.id;
  return h("div", {
    class: `row${s.replayed.length || s.copiedFrom ? " replayed" : ""}` +
      `${s.status === "skipped" ? " skipped" : ""}${selected ? " selected" : ""}`,
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
  const head = h("div", { class: "head" }, h("div", { class: "label" }, "Step"), axis);
  const overlay = h("div", { class: "bands" }, bands, lines);
  const rows = [...model.steps.map((s) => stepRow(model, s)), ...model.vms.map((vm) => vmRow(model, vm))];
  const list = root.querySelector(":scope > .rows");
  if (!list) {
    root.replaceChildren(head, h("div", { class: "rows" }, overlay, rows));
    return;
  }
  root.querySelector(":scope > .head").replaceWith(head);
  list.querySelector(":scope > .bands").replaceWith(overlay);
  keepRows(list, rows);
}

// A redraw keeps the element of each step's (and VM's) row and of what is inside it, changing
// only what changed: a row rebuilt between a press and its release lost the click (and a
// focused row its focus), and the page redraws with every event of a live run and every second.
function keepRows(list, rows) {
  const key = (row) => (row.dataset.step !== undefined ? `step:${row.dataset.step}` : `vm:${row.dataset.vm}`);
  const old = new Map([...list.querySelectorAll(":scope > .row")].map((row) => [key(row), row]));
  const wanted = rows.map((row) => {
    const before = old.get(key(row));
    if (!before) return row;
    old.delete(key(row));
    morph(before, row); // its listeners are the new row's: they name the same step
    return before;
  });
  for (const gone of old.values()) gone.remove();
  let at = list.querySelector(":scope > .bands").nextElementSibling;
  for (const row of wanted) {
    if (row === at) at = at.nextElementSibling;
    else list.insertBefore(row, at); // a new row, or one out of its place: moved only then
  }
}

// Make `old` what `now` is, keeping each node whose kind stays the same where it is.
function morph(old, now) {
  for (const name of old.getAttributeNames()) if (!now.hasAttribute(name)) old.removeAttribute(name);
  for (const { name, value } of now.attributes) {
    // A style through the CSSOM, as h() sets it: the page's CSP refuses style attributes.
    if (name === "style") { if (old.style.cssText !== now.style.cssText) old.style.cssText = now.style.cssText; }
    else if (old.getAttribute(name) !== value) old.setAttribute(name, value);
  }
  const before = [...old.childNodes];
  const after = [...now.childNodes];
  after.forEach((child, i) => {
    const was = before[i];
    if (!was) old.append(child);
    else if (was.nodeName !== child.nodeName) was.replaceWith(child);
    else if (child.nodeType === Node.TEXT_NODE) { if (was.data !== child.data) was.data = child.data; }
    else morph(was, child);
  });
  for (const extra of before.slice(after.length)) extra.remove();
}

// A microVM run's VM as a lane of its own: which runtime node and driver (gVisor and bubblewrap
// are named for what they are), why it ended, and what a resumed VM was served from the journal.
function vmRow(model, vm) {
  const ended = vm.open ? "running" : vm.reason;
  const lost = ["killed", "node_lost", "timeout"].includes(vm.reason);
  const resumed = vm.resume ? `LANTERN_RESUME=1, ${vm.served} step(s) served from the journal` : "";
  return h("div", { class: "row vm", "data-vm": vm.vmId },
    h("div", { class: "label" },
      h("div", { class: "name" }, h("strong", {}, `VM ${vm.attempt}`), " ",
        h("span", { class: "type" }, `${vm.driver} on ${vm.nodeId}`)),
      h("div", { class: "facts" },
        h("span", { class: `status ${lost ? "failed" : vm.open ? "in-flight" : "completed"}` }, ended),
        h("span", { class: "muted" }, ` ${vm.vmId}`),
        resumed ? h("span", { class: "badge replayed" }, resumed) : null)),
    h("div", { class: "track" },
      h("div", {
        class: `bar ${lost ? "failed" : vm.open ? "in-flight" : "completed"}`,
        style: place(model, vm.start, vm.end),
        title: `${vm.vmId} (${vm.driver}) on ${vm.nodeId}, attempt ${vm.attempt}: ${ended}`,
      }, `VM ${vm.attempt}: ${ended}`)));
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
  const parts = await stepDetails({
    get: state.get, runId, s, node: state.nodes && state.nodes.get(s.id),
    definitionProblem: state.definitionProblem, deliveries: state.deliveries,
    origin: model.origin,
  });
  const live = state.live.text(s.id);
  const done = s.events.some((e) => e.kind === "step_completed");
  if (!done && (live !== null || s.type === "ai-step" || s.type === "llm")) {
    parts.splice(2, 0, h("section", { class: "live-text" },
      h("h3", {}, "Text so far ", h("span", { class: "muted" }, "(live; not journaled)")),
      h("pre", { id: "live-text", "data-step": s.id }, live || "")));
  }
  panel.replaceChildren(...parts);
  panel.hidden = false;
}

function showLiveText(stepId) {
  const el = document.getElementById("live-text");
  if (el && el.dataset.step === stepId) el.textContent = state.live.text(stepId) || "";
  else if (state.selected === stepId) { detailsFor = null; draw(); }
}
