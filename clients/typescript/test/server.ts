// A real `lantern serve` on 127.0.0.1 for the client's tests: SQLite in a temporary folder, keys
// made with `lantern keys create`, as a user would. The server is the repository's own
// (.venv/bin/lantern, or LANTERN_BIN).
import { type ChildProcess, execFile, spawn } from "node:child_process";
import { mkdtempSync, openSync, readFileSync, rmSync } from "node:fs";
import { createServer } from "node:net";
import { tmpdir } from "node:os";
import { dirname, join, resolve } from "node:path";
import { fileURLToPath } from "node:url";
import { promisify } from "node:util";

// dist/test/server.js -> clients/typescript -> the repository.
export const ROOT = resolve(dirname(fileURLToPath(import.meta.url)), "../../../..");
export const LANTERN = process.env["LANTERN_BIN"] ?? join(ROOT, ".venv", "bin", "lantern");
export const ALL_SCOPES = "runs:execute,runs:read,runs:approve,agents:write,agents:read";

const run = promisify(execFile);
const started = new Set<ChildProcess>();
// A test process that ends (or fails) never leaves a server behind.
process.on("exit", () => {
  for (const child of started) child.kill("SIGKILL");
});

export async function freePort(): Promise<number> {
  return new Promise((done, fail) => {
    const probe = createServer();
    probe.once("error", fail);
    probe.listen(0, "127.0.0.1", () => {
      const address = probe.address();
      const port = typeof address === "object" && address !== null ? address.port : 0;
      probe.close(() => done(port));
    });
  });
}

export class Server {
  readonly folder: string;
  readonly databaseUrl: string;
  readonly log: string;
  port = 0;
  private child: ChildProcess | undefined;

  constructor(readonly env: Record<string, string> = {}) {
    this.folder = mkdtempSync(join(tmpdir(), "lantern-ts-"));
    this.databaseUrl = `sqlite:///${join(this.folder, "lantern.db")}`;
    this.log = join(this.folder, "serve.log");
  }

  get url(): string {
    return `http://127.0.0.1:${this.port}`;
  }

  private environment(): NodeJS.ProcessEnv {
    return {
      ...process.env,
      LANTERN_DATABASE_URL: this.databaseUrl,
      LANTERN_DATA_DIR: this.folder, // its receipt signing key
      LANTERN_PORT: String(this.port),
      LANTERN_WORKER_ID: `ts-test-${this.port}`,
      LANTERN_RATE_LIMIT: "0",
      ...this.env,
    };
  }

  /** Start (or start again, on the same port and database) and wait for /healthz. */
  async start(timeoutMs = 60_000): Promise<this> {
    if (this.port === 0) this.port = await freePort();
    const out = openSync(this.log, "a");
    const child = spawn(LANTERN, ["serve"], {
      env: this.environment(),
      cwd: this.folder,
      stdio: ["ignore", out, out],
    });
    this.child = child;
    started.add(child);
    const deadline = Date.now() + timeoutMs;
    while (Date.now() < deadline) {
      if (child.exitCode !== null || child.signalCode !== null) {
        throw new Error(`lantern serve exited: ${readFileSync(this.log, "utf8").slice(-2000)}`);
      }
      try {
        const answer = await fetch(`${this.url}/healthz`, { signal: AbortSignal.timeout(1000) });
        if (answer.status === 200) return this;
      } catch {
        // not listening yet
      }
      await sleep(50);
    }
    await this.kill();
    throw new Error(`lantern serve did not answer /healthz within ${timeoutMs} ms`);
  }

  /** SIGKILL: the server dies mid-whatever, as in a crash. */
  async kill(): Promise<void> {
    await this.end("SIGKILL");
  }

  async stop(): Promise<void> {
    await this.end("SIGTERM");
  }

  /** Stop it and delete its folder. */
  async close(): Promise<void> {
    await this.stop();
    rmSync(this.folder, { recursive: true, force: true });
  }

  private async end(signal: NodeJS.Signals): Promise<void> {
    const child = this.child;
    if (child === undefined) return;
    this.child = undefined;
    if (child.exitCode === null && child.signalCode === null) {
      const ended = new Promise((done) => child.once("exit", done));
      child.kill(signal);
      // A server that does not stop when asked is killed: a test never waits on it for long.
      const timer = setTimeout(() => child.kill("SIGKILL"), 15_000);
      await ended;
      clearTimeout(timer);
    }
    started.delete(child);
  }

  /** A new API key of a workspace, from `lantern keys create`. */
  async key(scopes = ALL_SCOPES, workspace = "default"): Promise<string> {
    const { stdout } = await run(
      LANTERN,
      ["keys", "create", "--scopes", scopes, "--workspace", workspace],
      { env: this.environment(), cwd: this.folder },
    );
    return stdout.trim();
  }

  /** An operator key (`lantern keys create --operator`): the cluster's own state. */
  async operatorKey(): Promise<string> {
    const { stdout } = await run(LANTERN, ["keys", "create", "--operator"], {
      env: this.environment(),
      cwd: this.folder,
    });
    return stdout.trim();
  }
}

export function sleep(ms: number): Promise<void> {
  return new Promise((done) => setTimeout(done, ms));
}
