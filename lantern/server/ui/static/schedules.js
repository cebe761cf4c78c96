// The workspace's schedules: when each fires next, whether it is paused, and its newest runs
// (GET /v1/schedules, then GET /v1/runs?schedule=NAME for each), read again every few seconds.

import { pageMessage, withKey } from "./api.js";
import { h, localTime } from "./dom.js";

const body = document.getElementById("schedules-body");
const empty = document.getElementById("schedules-empty");
const RECENT = 5; // runs listed per schedule
const POLL_MS = 5000;

let get = null;

function when(s) {
  const zone = s.timezone && s.timezone !== "UTC" ? ` (${s.timezone})` : "";
  return s.cron ? h("code", {}, s.cron, zone) : `every ${s.every}`;
}

function recentRuns(runs) {
  if (!runs.length) return h("span", { class: "muted" }, "none yet");
  return h("ul", { class: "recent-runs" }, runs.map((run) => h("li", { "data-run": run.id },
    h("a", { href: `/ui/runs/${encodeURIComponent(run.id)}`, class: "mono" }, run.id), " ",
    h("span", { class: `status ${run.status}` }, run.status), " ",
    h("span", { class: "muted" }, localTime(run.createdAt)))));
}

async function load() {
  const found = await get("/v1/schedules");
  const runs = await Promise.all(found.items.map((s) => get(
    `/v1/runs?${new URLSearchParams({ schedule: s.name, limit: String(RECENT) })}`)));
  body.replaceChildren(...found.items.map((s, i) => h("tr", { "data-schedule": s.name },
    h("td", {}, h("strong", {}, s.name)),
    h("td", {}, h("a", { href: `/ui/runs?${new URLSearchParams({ agentName: s.agentName })}` },
      s.agentName)),
    h("td", {}, when(s)),
    h("td", { class: "next-fire" }, s.paused ? h("span", { class: "muted" }, "none while paused")
      : localTime(s.nextFireAt)),
    h("td", {}, h("span", { class: `status ${s.paused ? "paused" : "active"}` },
      s.paused ? "paused" : "active")),
    h("td", {}, recentRuns(runs[i].items)))));
  empty.hidden = found.items.length > 0;
}

withKey(async (client) => {
  get = client;
  await load(); // the first read: a refused key surfaces here
  setInterval(() => load().then(() => pageMessage("")).catch((err) =>
    pageMessage(`Could not read the schedules: ${err.detail || err}`)), POLL_MS);
});
