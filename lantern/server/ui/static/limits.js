// The rate limits the workspace's model calls are held to (GET /v1/limits), each with what its
// last minute holds against its per-minute count, read again every few seconds.

import { pageMessage, withKey } from "./api.js";
import { h } from "./dom.js";

const body = document.getElementById("limits-body");
const empty = document.getElementById("limits-empty");
const POLL_MS = 3000;

let get = null;

// "used of limit", with a meter (a share of the limit, never past full); no count: no limit.
function fill(used, limit) {
  if (limit === null || limit === undefined) {
    return h("span", { class: "muted" }, `${used.toLocaleString()} (no limit)`);
  }
  return h("span", { class: "fill" },
    h("meter", { min: "0", max: String(limit), value: String(Math.min(used, limit)) }), " ",
    h("span", { class: "count" }, `${used.toLocaleString()} of ${limit.toLocaleString()}`));
}

async function load() {
  const found = await get("/v1/limits");
  body.replaceChildren(...found.items.map((l) => h("tr",
    { "data-limit": l.name, "data-scope": l.scope },
    h("td", {}, h("strong", {}, l.name)),
    h("td", {}, l.scope),
    h("td", {}, h("code", {}, l.match.model)),
    h("td", { class: "tokens" }, fill(l.used.tokens, l.tokensPerMinute)),
    h("td", { class: "requests" }, fill(l.used.requests, l.requestsPerMinute)))));
  empty.hidden = found.items.length > 0;
}

withKey(async (client) => {
  get = client;
  await load(); // the first read: a refused key surfaces here
  setInterval(() => load().then(() => pageMessage("")).catch((err) =>
    pageMessage(`Could not read the rate limits: ${err.detail || err}`)), POLL_MS);
});
