// The page's words for the journal: states, anomalies, waits.

export const STATE_LABEL = {
  completed: "completed",
  failed: "failed",
  retrying: "retried",
  "in flight": "in flight",
  cut: "in flight when its worker died",
  stopped: "stopped when the run ended",
  waiting: "waiting",
  skipped: "skipped: no edge into it was taken",
};

const POLICY = { record: "recorded", pause: "the run paused for a decision",
  fail: "the run failed by its policy" };

/** An anomaly_detected event {kind, detail, policy} in words. */
export function anomalyText(anomaly) {
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

/** Who decided at an approval, from its step_resumed data: "alice (key 1a2b3c)", "timeout". */
export function decidedBy(resumed) {
  const approver = resumed.approver;
  if (approver && approver.keyId) {
    return approver.keyName ? `${approver.keyName} (key ${approver.keyId})` : `key ${approver.keyId}`;
  }
  return resumed.by || "someone";
}

/** What a wait waits for: "approval", "sub-agent", "signal payment". */
export function waitsFor(wait, s) {
  const kind = wait.kind || s.type;
  if (kind === "subagent") return "sub-agent";
  if (kind === "signal" && wait.data && wait.data.name) return `signal ${wait.data.name}`;
  return kind || "an event";
}
