// The API key (kept in this tab's sessionStorage) and reads from Lantern's REST API.

const STORAGE = "lantern.apiKey";

export class ApiError extends Error {
  constructor(status, title, detail) {
    super(`${title}: ${detail}`);
    this.status = status;
    this.title = title;
    this.detail = detail;
  }
}

/**
 * A GET against the API with `key`; a problem+json answer becomes an ApiError. The function
 * also has `post(path, body)`, for the actions a page offers (approve, reject, cancel).
 */
export function client(key) {
  async function request(method, path, body) {
    let response;
    const headers = { Authorization: `Bearer ${key}`, Accept: "application/json" };
    if (body !== undefined) headers["Content-Type"] = "application/json";
    try {
      response = await fetch(path, {
        method,
        headers,
        body: body === undefined ? undefined : JSON.stringify(body),
        cache: "no-store",
      });
    } catch (err) {
      throw new ApiError(0, "No answer", `the server did not answer (${err.message})`);
    }
    if (!response.ok) {
      let title = response.statusText || "Error";
      let detail = `HTTP ${response.status}`;
      try {
        const problem = await response.json();
        title = problem.title || title;
        detail = problem.detail || detail;
      } catch {
        // not problem+json: keep the status line
      }
      throw new ApiError(response.status, title, detail);
    }
    return response.json();
  }
  const get = (path) => request("GET", path);
  get.post = (path, body = {}) => request("POST", path, body);
  // A streamed read (the run's Server-Sent Events): the response, its body unread.
  get.open = async function open(path, headers = {}) {
    const response = await fetch(path, {
      headers: { Authorization: `Bearer ${key}`, Accept: "text/event-stream", ...headers },
      cache: "no-store",
    });
    if (!response.ok) {
      let detail = `HTTP ${response.status}`;
      try {
        detail = (await response.json()).detail || detail;
      } catch {
        // not problem+json
      }
      throw new ApiError(response.status, response.statusText || "Error", detail);
    }
    return response;
  };
  return get;
}

export function isKeyProblem(err) {
  return err instanceof ApiError && (err.status === 401 || err.status === 403);
}

function say(element, text, kind = "error") {
  element.textContent = text;
  element.className = `message ${kind}`;
  element.hidden = !text;
}

/** Show `text` in the page's message line ("" hides it). */
export function pageMessage(text, kind = "error") {
  say(document.getElementById("page-message"), text, kind);
}

/**
 * Start the page with an API key: the one kept in this session, or one the user gives.
 * `start(get)` must make the page's first read, so a key the server refuses (401, or 403:
 * a missing scope or another workspace) brings the prompt back with the server's reason.
 */
export function withKey(start) {
  const prompt = document.getElementById("key-prompt");
  const form = document.getElementById("key-form");
  const input = document.getElementById("key-input");
  const message = document.getElementById("key-message");
  const page = document.getElementById("page");
  const forget = document.getElementById("forget-key");

  forget.addEventListener("click", () => {
    sessionStorage.removeItem(STORAGE);
    window.location.reload();
  });

  function ask(reason) {
    page.hidden = true;
    forget.hidden = true;
    prompt.hidden = false;
    say(message, reason);
    input.value = "";
    input.focus();
  }

  async function begin(key, given) {
    try {
      await start(client(key), (reason) => {
        sessionStorage.removeItem(STORAGE);
        ask(reason);
      });
    } catch (err) {
      if (!isKeyProblem(err)) {
        // Not the key's fault (a missing run, the server away): keep the key, say so.
        if (given) sessionStorage.setItem(STORAGE, key);
        prompt.hidden = true;
        page.hidden = false;
        forget.hidden = false;
        pageMessage(err instanceof ApiError ? `${err.title}: ${err.detail}` : String(err));
        return;
      }
      sessionStorage.removeItem(STORAGE);
      const verb = err.status === 401 ? "did not accept this key" : "refused this key here";
      ask(`The server ${verb}: ${err.detail}. Check the key and try again.`);
      return;
    }
    if (given) sessionStorage.setItem(STORAGE, key);
    prompt.hidden = true;
    page.hidden = false;
    forget.hidden = false;
  }

  form.addEventListener("submit", (event) => {
    event.preventDefault();
    const key = input.value.trim();
    if (!key) {
      say(message, "Paste an API key first (it starts with lk_).");
      return;
    }
    say(message, "Checking the key…", "info");
    begin(key, true);
  });

  // A key given in the address's fragment (`/ui/runs#key=lk_...`), for a script, a screenshot
  // or a headless browser that cannot type into the form. A fragment never reaches the server
  // (no access log holds it); it is taken off the address at once, so the key is neither left
  // in the history nor in a link copied from the page.
  const fragment = new URLSearchParams(window.location.hash.slice(1)).get("key");
  if (fragment) {
    history.replaceState(null, "", window.location.pathname + window.location.search);
    begin(fragment.trim(), true);
    return;
  }
  const kept = sessionStorage.getItem(STORAGE);
  if (kept) begin(kept, false);
  else ask("");
}
