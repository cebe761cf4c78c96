// The runs list: newest first, filtered by status (the server-rendered links set the filter).

import { pageMessage, withKey } from "./api.js";
import { h, localTime } from "./dom.js";

const page = document.getElementById("page");
const body = document.getElementById("runs-body");
const more = document.getElementById("more");
const empty = document.getElementById("runs-empty");
let get = null;
let cursor = null;

function query() {
  const params = new URLSearchParams({ limit: "50" });
  if (page.dataset.status) params.set("status", page.dataset.status);
  if (page.dataset.agent) params.set("agentName", page.dataset.agent);
  if (cursor) params.set("cursor", cursor);
  return `/v1/runs?${params}`;
}

async function load() {
  const found = await get(query());
  body.append(...found.items.map((run) => h("tr", { "data-run": run.id },
    h("td", {}, h("a", { href: `/ui/runs/${encodeURIComponent(run.id)}`, class: "mono" }, run.id)),
    h("td", {}, `${run.agentName} v${run.agentVersion}`),
    h("td", {}, h("span", { class: `status ${run.status}` }, run.status)),
    h("td", {}, localTime(run.createdAt)),
    h("td", {}, localTime(run.updatedAt)))));
  cursor = found.nextCursor;
  more.hidden = !cursor;
  empty.hidden = body.children.length > 0;
}

more.addEventListener("click", () =>
  load().catch((err) => pageMessage(`Could not read more runs: ${err.detail || err}`)));

withKey(async (client) => {
  get = client;
  body.replaceChildren();
  cursor = null;
  await load();
});
