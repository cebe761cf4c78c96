// From a run's journal to the waterfall's rows: the same reading as `lantern runs show`
// (lantern/waterfall.py), with each attempt, backoff, wait and crash kept apart.

export const TERMINAL = new Set(["run_succeeded", "run_failed", "run_cancelled"]);

/** Milliseconds since the epoch of an event's `at` (ISO 8601; the journal keeps ms). */
export function parseAt(iso) {
  const trimmed = String(iso).replace(/(\.\d{3})\d+/, "$1");
  return Date.parse(trimmed);
}

function newStep(id) {
  return {
    id,
    type: "",
    attempts: [], // {attempt, start, end, state, segments: [{start, end, state, rerun}], error}
    open: null, // the attempt started and not yet ended
    backoffs: [], // {start, end, retry}
    pendingBackoff: null,
    waits: [], // {start, end, reason}
    retries: [], // step_retrying data, with its time
    replayed: [], // the recoveries that served this step from the journal
    rerun: false, // in flight at a crash, so run again with the same attempt (and key)
    copiedFrom: null, // {runId, seq, hash}: a retry replayed it from the run it retries
    anomalies: [],
    events: [],
    output: undefined,
    outputRef: null,
    error: null,
    status: "in flight",
  };
}

function closeSegment(attempt, end, state) {
  attempt.segments.push({ start: attempt.segStart, end, state, rerun: attempt.rerun });
  attempt.segStart = null;
}

/**
 * Fold events (in seq order) into {origin, end, steps, bands, anomalies, terminal}.
 * `now` (ms) is where bars still open end while the run is going.
 */
export function buildModel(events, now) {
  const steps = new Map();
  const bands = [];
  const anomalies = [];
  const step = (id) => {
    if (!steps.has(id)) steps.set(id, newStep(id));
    return steps.get(id);
  };
  const origin = events.length ? parseAt(events[0].at) : now;
  let previous = origin;
  let last = origin;
  let terminal = null;

  for (const e of events) {
    const at = parseAt(e.at);
    const data = e.data || {};
    last = Math.max(last, at);
    const s = e.stepId ? step(e.stepId) : null;
    if (s) s.events.push(e);
    switch (e.kind) {
      case "step_started": {
        s.type = data.type || s.type;
        if (data.replayedFrom) s.copiedFrom = data.replayedFrom; // a retry copied it
        const number = e.attempt || 1;
        if (s.open && s.open.attempt === number) break;
        if (s.pendingBackoff) {
          s.backoffs.push({ ...s.pendingBackoff, end: at });
          s.pendingBackoff = null;
        }
        s.open = { attempt: number, start: at, end: null, state: "in flight", segments: [],
          segStart: at, rerun: false, error: null };
        s.attempts.push(s.open);
        s.status = "in flight";
        break;
      }
      case "step_completed":
      case "step_failed":
      case "step_retrying": {
        const state = { step_completed: "completed", step_failed: "failed",
          step_retrying: "retrying" }[e.kind];
        let attempt = s.open;
        if (!attempt) {
          // An end without its start in view: draw it as a point rather than lose it.
          attempt = { attempt: e.attempt || 1, start: at, segments: [], segStart: at,
            rerun: false, error: null };
          s.attempts.push(attempt);
        }
        closeSegment(attempt, at, state);
        attempt.end = at;
        attempt.state = state;
        s.open = null;
        s.status = state;
        if (e.kind === "step_completed") {
          if ("outputRef" in data) s.outputRef = { ref: data.outputRef, bytes: data.outputBytes };
          else s.output = data.output;
        } else {
          attempt.error = data.error ?? null;
          s.error = data.error ?? null;
        }
        if (e.kind === "step_retrying") {
          s.retries.push({ ...data, at, seq: e.seq });
          s.pendingBackoff = { start: at, retry: data };
        }
        for (const wait of s.waits) if (wait.end === null) wait.end = at;
        break;
      }
      case "step_skipped":
        // No edge into it was taken: it never runs (a "when" or an approval's "on" decided).
        s.type = data.type || s.type;
        s.status = "skipped";
        break;
      case "step_waiting":
        // kind: "approval", "signal" or "subagent"; an anomaly's pause is an approval with no
        // start.
        s.waits.push({ start: at, end: null, kind: data.kind || "", data, resumed: null });
        if (!s.type) s.type = data.kind || "";
        s.status = "waiting";
        break;
      case "step_resumed":
        for (const wait of s.waits) {
          if (wait.end === null) Object.assign(wait, { end: at, resumed: data });
        }
        s.status = s.open ? "in flight" : "completed";
        break;
      case "anomaly_detected": {
        // A run's event; the step it concerns, when there is one, is in its detail.
        const stepId = e.stepId || (data.detail && data.detail.step) || null;
        const anomaly = { at, seq: e.seq, stepId, data };
        anomalies.push(anomaly);
        if (stepId) step(stepId).anomalies.push(anomaly);
        break;
      }
      case "run_recovered": {
        // The gap from the last event of the dead drive to the recovery: the crash.
        const band = { start: previous, end: at, seq: e.seq, from: data.fromWorker,
          to: data.toWorker, epoch: data.epoch, attempt: data.attempt,
          replayed: data.replayed || [], inFlight: data.inFlight || [] };
        bands.push(band);
        for (const id of band.replayed) if (steps.has(id)) steps.get(id).replayed.push(band);
        for (const id of band.inFlight) {
          const s2 = step(id);
          s2.rerun = true;
          const attempt = s2.open;
          if (attempt && attempt.segStart !== null) {
            // It was in flight up to some moment inside the gap that no event records.
            closeSegment(attempt, at, "cut");
            attempt.segStart = at;
            attempt.rerun = true;
          }
        }
        break;
      }
      default:
        if (TERMINAL.has(e.kind)) terminal = { kind: e.kind, at, data };
    }
    previous = at;
  }

  const end = terminal ? terminal.at : Math.max(last, now);
  for (const s of steps.values()) {
    if (s.open) {
      // Still running; or the run ended around it (cancelled, or a sibling failed).
      const state = terminal ? "stopped" : "in flight";
      if (s.open.segStart !== null) closeSegment(s.open, end, state);
      s.open.state = state;
      s.status = s.waits.some((w) => w.end === null) && !terminal ? "waiting" : state;
    }
    if (s.pendingBackoff) {
      s.backoffs.push({ ...s.pendingBackoff, end, open: !terminal });
    }
    for (const wait of s.waits) if (wait.end === null) { wait.end = end; wait.open = true; }
  }
  return { origin, end, steps: [...steps.values()], bands, anomalies, terminal, vms: vmLanes(events, end) };
}

/**
 * A microVM run's VMs (the vm_* events): one lane each, with its runtime node, driver, attempt,
 * how it ended, and for a resumed VM how many completed steps the journal served it.
 */
export function vmLanes(events, end) {
  const lanes = new Map();
  let completed = 0;
  for (const e of events) {
    if (e.kind === "step_completed") completed += 1;
    const data = e.data || {};
    if (!e.kind.startsWith("vm_") || typeof data.vmId !== "string") continue;
    const at = parseAt(e.at);
    if (e.kind === "vm_scheduled") {
      lanes.set(data.vmId, {
        vmId: data.vmId, nodeId: data.nodeId, driver: data.driver, attempt: data.attempt,
        resume: Boolean(data.resume), start: at, booted: null, end: null, reason: "",
        served: data.resume ? completed : 0,
      });
    }
    const lane = lanes.get(data.vmId);
    if (!lane) continue;
    if (e.kind === "vm_started") lane.booted = at;
    if (e.kind === "vm_exited" || e.kind === "vm_terminated") {
      lane.end = at;
      lane.reason = data.reason || "";
    }
  }
  for (const lane of lanes.values()) if (lane.end === null) { lane.end = end; lane.open = true; }
  return [...lanes.values()];
}

/** "offline" when the step's output says the built-in offline provider made it. */
export function provider(stepModel, node) {
  const output = stepModel.output;
  if (output && typeof output === "object" && typeof output.provider === "string") {
    return output.provider;
  }
  const model = node && node.data && node.data.model;
  if (typeof model === "string" && model.startsWith("offline/")) return "offline";
  return null;
}

/** Axis ticks: about `count` round values (1, 2 or 5 × 10^k ms) from 0 to `span`. */
export function ticks(span, count = 6) {
  const raw = Math.max(span, 1) / count;
  const power = 10 ** Math.floor(Math.log10(raw));
  const step = [1, 2, 5, 10].map((m) => m * power).find((v) => v >= raw);
  const out = [];
  for (let t = 0; t <= span + 1e-9; t += step) out.push(t);
  return out;
}

/** sha256("runID|stepID|attempt") in lowercase hex: the key every side effect carries. */
export async function idempotencyKey(runId, stepId, attempt) {
  const bytes = new TextEncoder().encode(`${runId}|${stepId}|${attempt}`);
  const digest = await crypto.subtle.digest("SHA-256", bytes);
  return [...new Uint8Array(digest)].map((b) => b.toString(16).padStart(2, "0")).join("");
}
