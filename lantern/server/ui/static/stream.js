// Following a run over GET /v1/runs/{id}/stream (Server-Sent Events) with fetch, so the API key
// goes in the Authorization header as for every other read. Reconnects with Last-Event-ID;
// ends after the run's terminal event (or a 204: it had ended and we had seen the end).

const RECONNECT_MS = 1000;

function frames(text) {
  // Complete frames in `text` and what is left of an incomplete one.
  const out = [];
  const parts = text.split(/\r?\n\r?\n/);
  const rest = parts.pop();
  for (const part of parts) {
    let event = "message";
    const data = [];
    let id = null;
    for (const line of part.split(/\r?\n/)) {
      if (!line || line.startsWith(":")) continue;
      const colon = line.indexOf(":");
      const name = colon < 0 ? line : line.slice(0, colon);
      let value = colon < 0 ? "" : line.slice(colon + 1);
      if (value.startsWith(" ")) value = value.slice(1);
      if (name === "event") event = value;
      else if (name === "data") data.push(value);
      else if (name === "id") id = value;
    }
    if (data.length) out.push({ event, id, data: JSON.parse(data.join("\n")) });
  }
  return { out, rest };
}

/**
 * Call `onFrame({event, data})` for each frame of the run's stream after seq `after`, until the
 * run ends; `onTrouble(err)` when the connection fails (it is retried; a key problem is not).
 * Resolves once the run has ended.
 */
export async function followStream(open, path, after, onFrame, onTrouble) {
  let seen = after;
  for (;;) {
    let response;
    try {
      response = await open(`${path}/stream`, seen ? { "Last-Event-ID": String(seen) } : {});
    } catch (err) {
      onTrouble(err);
      await new Promise((resolve) => setTimeout(resolve, RECONNECT_MS));
      continue;
    }
    if (response.status === 204) return;
    const reader = response.body.getReader();
    const decoder = new TextDecoder();
    let buffer = "";
    try {
      for (;;) {
        const { value, done } = await reader.read();
        if (done) break;
        buffer += decoder.decode(value, { stream: true });
        const { out, rest } = frames(buffer);
        buffer = rest;
        for (const frame of out) {
          if (frame.event === "journal") seen = frame.data.seq;
          onFrame(frame);
          if (frame.event === "journal" && TERMINAL_KINDS.has(frame.data.kind)) return;
        }
      }
    } catch (err) {
      onTrouble(err);
    }
    await new Promise((resolve) => setTimeout(resolve, RECONNECT_MS));
  }
}

const TERMINAL_KINDS = new Set(["run_succeeded", "run_failed", "run_cancelled"]);

/** Each step's live text, built from delta and reset frames by their offsets. */
export class LiveTexts {
  constructor() {
    this.texts = new Map(); // step id -> { attempt, text }
  }

  apply(frame) {
    const d = frame.data;
    const shown = this.texts.get(d.stepId);
    if (frame.event === "reset") {
      if (!shown || d.attempt >= shown.attempt) this.texts.set(d.stepId, { attempt: d.attempt, text: "" });
      return d.stepId;
    }
    if (shown && d.attempt < shown.attempt) return null; // a late piece of a replaced attempt
    const before = shown && shown.attempt === d.attempt ? shown.text : "";
    this.texts.set(d.stepId, { attempt: d.attempt, text: before.slice(0, d.offset) + d.text });
    return d.stepId;
  }

  text(stepId) {
    const t = this.texts.get(stepId);
    return t ? t.text : null;
  }
}
