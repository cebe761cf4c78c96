// Pending approvals across the workspace's runs, oldest first, with their decision buttons.

import { pageMessage, withKey } from "./api.js";
import { can, decisionForm, whoAmI } from "./actions.js";
import { h, localTime } from "./dom.js";

const body = document.getElementById("approvals-body");
const empty = document.getElementById("approvals-empty");
const POLL_MS = 2000;

let get = null;
let me = null;
let shown = "";

async function load() {
  const found = await get("/v1/approvals?status=pending");
  const signature = JSON.stringify(found.items.map((p) => [p.runId, p.nodeId]));
  if (signature === shown) return; // keep comments being typed
  shown = signature;
  body.replaceChildren(...found.items.map((p) => h("tr", { "data-run": p.runId, "data-node": p.nodeId },
    h("td", {}, h("a", { href: `/ui/runs/${encodeURIComponent(p.runId)}`, class: "mono" }, p.runId)),
    h("td", {}, p.agentName),
    h("td", {}, localTime(p.since)),
    h("td", {}, can(me, "runs:approve")
      ? decisionForm({ get, runId: p.runId, nodeId: p.nodeId, prompt: p.prompt,
        say: (text, kind) => pageMessage(text, kind), done: () => load() })
      : [h("strong", {}, p.nodeId), p.prompt ? `: “${p.prompt}”` : ""]))));
  empty.hidden = found.items.length > 0;
}

withKey(async (client) => {
  get = client;
  me = await whoAmI(get);
  await load();
  setInterval(() => load().catch((err) => pageMessage(`Could not read approvals: ${err.detail || err}`)),
    POLL_MS);
});
