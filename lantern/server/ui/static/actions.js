// Acting on a run from the page: approve or reject an approval it waits on, and cancel it.
// Which buttons show follows the key's scopes (GET /v1/keys/self); the server checks every
// action's scope again, so a hidden button is a courtesy, not the guard.

import { ApiError } from "./api.js";
import { h } from "./dom.js";

/** The calling key ({id, name, workspace, scopes}), or null when it cannot be read. */
export async function whoAmI(get) {
  try {
    return await get("/v1/keys/self");
  } catch (err) {
    if (err instanceof ApiError) return null;
    throw err;
  }
}

export function can(me, scope) {
  return Boolean(me) && (me.scopes.includes(scope) || me.scopes.includes("admin"));
}

function problem(err) {
  return err instanceof ApiError ? `${err.title}: ${err.detail}` : String(err);
}

/** Approve and reject buttons, with a comment box, for approval `nodeId` of run `runId`. */
export function decisionForm({ get, runId, nodeId, prompt, say, done }) {
  const comment = h("textarea", { rows: 2, maxlength: 10000,
    placeholder: "Why (kept with the decision in the journal)" });
  const buttons = [];
  const decide = async (decision) => {
    for (const b of buttons) b.disabled = true;
    const body = { decision };
    if (comment.value.trim()) body.comment = comment.value.trim();
    try {
      const path = `/v1/runs/${encodeURIComponent(runId)}/approvals/${encodeURIComponent(nodeId)}`;
      const made = await get.post(path, body);
      say(`${made.decision === "approved" ? "Approved" : "Rejected"} ${nodeId}` +
        ` as ${made.decidedByName || made.decidedBy}; the run resumes.`, "info");
      done(nodeId, made);
    } catch (err) {
      for (const b of buttons) b.disabled = false;
      say(`Could not ${decision} ${nodeId}: ${problem(err)}`);
    }
  };
  buttons.push(
    h("button", { type: "button", class: "approve", onclick: () => decide("approve") }, "Approve"),
    h("button", { type: "button", class: "reject", onclick: () => decide("reject") }, "Reject"),
  );
  return h("div", { class: "decision", "data-node": nodeId },
    h("p", {}, h("strong", {}, nodeId), prompt ? `: “${prompt}”` : ""),
    h("label", {}, "Comment", comment), // a label around its box: one per run and node
    h("div", { class: "buttons" }, buttons));
}

let shown = null; // what the panel shows now: it is redrawn only when that changes

/**
 * The run page's actions: a decision form per open approval and a cancel button, as the
 * key's scopes allow. `model` is the waterfall's reading of the journal.
 */
export function renderActions({ get, me, run, model, finished, decided, onAction }) {
  const root = document.getElementById("actions");
  const open = finished ? [] : model.steps.flatMap((s) => s.waits
    .filter((w) => w.open && w.kind === "approval" && !decided.has(s.id))
    .map((w) => ({ nodeId: s.id, prompt: (w.data || {}).prompt })));
  const canCancel = !finished && can(me, "runs:execute");
  const signature = JSON.stringify([open, canCancel, can(me, "runs:approve"),
    finished, run.cancelRequested]);
  if (signature === shown) return;
  shown = signature;
  const message = h("p", { id: "action-message", class: "message", role: "status", hidden: true });
  const say = (text, kind = "error") => {
    message.textContent = text;
    message.className = `message ${kind}`;
    message.hidden = !text;
  };
  const parts = [];
  if (open.length && can(me, "runs:approve")) {
    for (const o of open) {
      parts.push(decisionForm({ get, runId: run.id, ...o, say,
        done: (nodeId) => { decided.add(nodeId); onAction(); } }));
    }
  } else if (open.length) {
    parts.push(h("p", { class: "muted" }, `The run waits for a decision at ${open.map((o) =>
      o.nodeId).join(", ")}; this key cannot decide (it lacks the runs:approve scope).`));
  }
  if (canCancel) {
    const button = h("button", { type: "button", id: "cancel-run", class: "danger" }, "Cancel run");
    button.addEventListener("click", async () => {
      button.disabled = true;
      try {
        const after = await get.post(`/v1/runs/${encodeURIComponent(run.id)}/cancel`);
        say(after.status === "cancelled" ? "Cancelled." : "Cancel requested; the replica " +
          "running it stops it (an async step at once, a sync tool at its end).", "info");
        onAction();
      } catch (err) {
        button.disabled = false;
        say(`Could not cancel: ${problem(err)}`);
      }
    });
    parts.push(h("div", { class: "buttons" }, button,
      run.cancelRequested ? h("span", { class: "muted" }, " cancel requested") : null));
  }
  root.hidden = parts.length === 0;
  root.replaceChildren(h("h2", {}, "Act on this run"), ...parts, message);
}
