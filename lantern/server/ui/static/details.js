// The details of one step: its definition, output, keys, waits, deliveries and events.

import { duration, h, json, localTime } from "./dom.js";
import { idempotencyKey, parseAt, provider } from "./model.js";
import { decidedBy, STATE_LABEL, waitsFor } from "./words.js";

/** The panel's content for step model `s` of run `runId` (`node`: its definition, if read). */
export async function stepDetails({ get, runId, s, node, definitionProblem, deliveries, origin }) {
  const keys = await Promise.all(s.attempts.map(async (a) =>
    [a.attempt, await idempotencyKey(runId, s.id, a.attempt)]));
  const notes = [];
  for (const band of s.replayed) {
    notes.push(`Replayed: when ${band.to || "a worker"} re-drove the run (event ${band.seq}), ` +
      "this step's output was served from the journal; the step was not run again.");
  }
  if (s.copiedFrom) {
    const from = s.copiedFrom;
    notes.push(h("span", {}, "Replayed from the run this one retries (",
      h("a", { href: `/ui/runs/${encodeURIComponent(from.runId)}` }, from.runId),
      `, event ${from.seq}): its output was copied, the step was not run again.`));
  }
  if (s.status === "skipped") {
    notes.push("Skipped: no edge into this step was taken (an edge's \"when\" was false, or " +
      "an approval went the other way), so it never ran.");
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
      outcome = `; ${r.decision} by ${decidedBy(r)}${r.comment ? ` (“${r.comment}”)` : ""}`;
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
    : [h("p", { class: "muted" }, definitionProblem
      ? `The definition could not be read (${definitionProblem}); a key with the ` +
        "agents:read scope shows it. The step's events are below."
      : "No definition for this step.")];
  let output;
  if (s.outputRef) {
    output = storedApart(get, runId, s.outputRef);
  } else if (s.output !== undefined) {
    output = h("pre", { id: "step-output" }, json(s.output));
  } else {
    output = h("p", { class: "muted" }, "No output yet.");
  }
  const stepDeliveries = deliveries.filter((d) => d.stepId === s.id);
  return [
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
        h("td", { title: localTime(e.at) }, `+${duration(parseAt(e.at) - origin)}`),
        h("td", {}, e.kind),
        h("td", {}, e.attempt ?? ""), h("td", {}, h("code", {}, JSON.stringify(e.data)))))),
    ),
  ].flat().filter(Boolean);
}

/** An output over 16 KiB, stored apart from its event: "show" reads it (GET .../blobs/{ref})
 * into a collapsed block that names its size; opening the block shows the value. */
function storedApart(get, runId, ref) {
  const size = `${ref.bytes.toLocaleString()} bytes`;
  const place = h("div", { id: "step-output-apart" });
  const button = h("button", {
    type: "button",
    onclick: async () => {
      button.disabled = true;
      try {
        const value = await get(`/v1/runs/${encodeURIComponent(runId)}/blobs/` +
          encodeURIComponent(ref.ref));
        place.replaceChildren(h("details", { id: "step-output-stored" },
          h("summary", {}, `Output (${size}, stored apart as ${ref.ref})`),
          h("pre", { id: "step-output" }, json(value))));
      } catch (err) {
        button.disabled = false;
        place.append(h("p", { class: "error" }, `Could not read it: ${err.message}`));
      }
    },
  }, "show");
  place.append(h("p", {}, `Stored apart from the event (${size}, ${ref.ref}). `, button));
  return place;
}
