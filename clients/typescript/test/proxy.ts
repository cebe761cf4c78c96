// A real HTTP server on 127.0.0.1 in front of `lantern serve` that, request by request, forwards,
// forwards and then drops the connection (the answer lost on the way back), or answers itself
// (a 503 from a load balancer, an HTML page from a wrong URL). It records what it saw.
import { type IncomingMessage, type Server, type ServerResponse, createServer } from "node:http";

export interface Seen {
  method: string;
  path: string;
  headers: IncomingMessage["headers"];
}

export type Plan =
  | "forward"
  | "forward-then-drop"
  | { status: number; headers?: Record<string, string>; body: string };

export class Proxy {
  readonly seen: Seen[] = [];
  private server: Server | undefined;
  port = 0;

  constructor(
    readonly target: string,
    readonly plan: (request: Seen, index: number) => Plan,
  ) {}

  get url(): string {
    return `http://127.0.0.1:${this.port}`;
  }

  async start(): Promise<this> {
    const server = createServer((request, response) => {
      void this.handle(request, response);
    });
    this.server = server;
    await new Promise<void>((done) => server.listen(0, "127.0.0.1", done));
    const address = server.address();
    this.port = typeof address === "object" && address !== null ? address.port : 0;
    return this;
  }

  async close(): Promise<void> {
    const server = this.server;
    if (server === undefined) return;
    server.closeAllConnections();
    await new Promise((done) => server.close(done));
  }

  private async handle(request: IncomingMessage, response: ServerResponse): Promise<void> {
    const chunks: Buffer[] = [];
    for await (const chunk of request) chunks.push(chunk as Buffer);
    const seen = { method: request.method ?? "GET", path: request.url ?? "/", headers: request.headers };
    this.seen.push(seen);
    const plan = this.plan(seen, this.seen.length - 1);
    if (typeof plan === "object") {
      response.writeHead(plan.status, plan.headers ?? {});
      response.end(plan.body);
      return;
    }
    const headers = new Headers();
    for (const [name, value] of Object.entries(request.headers)) {
      if (typeof value === "string" && !["host", "connection", "content-length"].includes(name)) {
        headers.set(name, value);
      }
    }
    const body = chunks.length > 0 ? Buffer.concat(chunks) : null;
    const answer = await fetch(this.target + seen.path, { method: seen.method, headers, body });
    const text = await answer.text();
    if (plan === "forward-then-drop") {
      request.socket.destroy(); // the server did it; its answer never reaches the client
      return;
    }
    response.writeHead(answer.status, { "content-type": answer.headers.get("content-type") ?? "" });
    response.end(text);
  }
}
