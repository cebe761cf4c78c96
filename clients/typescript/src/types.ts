// The API's shapes, taken from src/openapi.ts (generated from the server's /openapi.json), so a
// field the server renames or drops breaks the client's build rather than its users' code. The
// suite compiles the client against the document of the server it tests (test/openapi.test.ts).
import type { components, paths } from "./openapi.js";

type Schemas = components["schemas"];

/** The JSON body a path and method answer with, at a status the document must declare. */
type Answer<
  P extends keyof paths,
  M extends keyof paths[P],
  S extends keyof Responses<P, M>,
> = Responses<P, M>[S] extends { content: { "application/json": infer T } } ? T : never;
type Responses<P extends keyof paths, M extends keyof paths[P]> = paths[P][M] extends {
  responses: infer R;
}
  ? R
  : never;
/** The query parameters a path and method take. */
type Query<P extends keyof paths, M extends keyof paths[P]> = paths[P][M] extends {
  parameters: { query?: infer Q };
}
  ? NonNullable<Q>
  : never;

export type Run = Answer<"/v1/runs/{run_id}", "get", 200>;
export type RunStatus = Run["status"];
export type Usage = Schemas["Usage"];
export type Event = Schemas["EventOut"];
export type EventPage = Answer<"/v1/runs/{run_id}/events", "get", 200>;
export type RunPage = Answer<"/v1/runs", "get", 200>;
export type Agent = Answer<"/v1/agents/{name}", "get", 200>;
export type AgentPage = Answer<"/v1/agents", "get", 200>;
/** What an approval's decision recorded (`approved` or `rejected`, by whom, the comment). */
export type DecisionRecord = Answer<"/v1/runs/{run_id}/approvals/{node_id}", "post", 202>;
export type PendingApproval = Schemas["PendingApprovalOut"];
export type Receipt = Answer<"/v1/runs/{run_id}/receipt", "get", 200>;
export type Jwk = Schemas["Jwk"];
export type Delivery = Schemas["DeliveryOut"];
export type DeliveryList = Answer<"/v1/runs/{run_id}/deliveries", "get", 200>;
export type Secret = Answer<"/v1/secrets/{name}", "put", 200>;
export type SecretPage = Answer<"/v1/secrets", "get", 200>;
export type Worker = Schemas["WorkerOut"];
export type WorkerPage = Answer<"/v1/workers", "get", 200>;
export type ResumeBody = Schemas["Resume"];
export type ResumeAnswer = Answer<"/v1/runs/{run_id}/resume", "post", 202>;
export type Problem = Schemas["Problem"];

export type CreateRunBody = Schemas["CreateRun"];
export type DecisionBody = Schemas["Decision"];
export type RetryBody = Schemas["RetryRun"];
export type ListRunsQuery = Query<"/v1/runs", "get">;
export type EventsQuery = Query<"/v1/runs/{run_id}/events", "get">;
export type ApprovalsQuery = Query<"/v1/approvals", "get">;

export type CancelAnswer = Answer<"/v1/runs/{run_id}/cancel", "post", 202>;
export type RetryAnswer = Answer<"/v1/runs/{run_id}/retry", "post", 202>;
export type CreateAnswer = Answer<"/v1/runs", "post", 202>;

/** One page of a listing; pass `nextCursor` back as `cursor` for the next one. */
export interface Page<T> {
  items: T[];
  nextCursor: string | null;
}

/** What `POST /v1/runs/{id}/signals/{name}` answers (docs/signals.md): the signal's id, its
 * name and its run. */
export type SignalSent = Answer<"/v1/runs/{run_id}/signals/{name}", "post", 202>;

export const TERMINAL_STATUSES: ReadonlySet<RunStatus> = new Set<RunStatus>([
  "succeeded",
  "failed",
  "cancelled",
]);

/** Succeeded, failed or cancelled: nothing more will happen to the run. */
export function isFinished(run: Pick<Run, "status">): boolean {
  return TERMINAL_STATUSES.has(run.status);
}
