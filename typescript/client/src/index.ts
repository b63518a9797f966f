/**
 * @delivery-ledger/client: publish runs to delivery-ledger's HTTP ingest API (`ledger api`)
 * and read where they stand. The request and answer types are generated from the API's
 * OpenAPI document (openapi.json, checked against the app by the Python tests).
 */
import type { components, paths } from "./schema.js";

export {
  canonicalJson,
  idempotencyKey,
  MAX_EXACT_INTEGER,
  PAYLOAD_HASH_PREFIX,
  parsePayload,
  PayloadHashError,
  payloadHash,
} from "./hashes.js";
export type { components, paths } from "./schema.js";

type Schemas = components["schemas"];
type JsonBody<T> = T extends { requestBody?: { content: { "application/json": infer B } } } ? B : never;

export type CompleteRun = JsonBody<paths["/v1/runs/{run_id}/complete"]["post"]>;
export type FailRun = JsonBody<paths["/v1/runs/{run_id}/fail"]["post"]>;
export type MarkRunUnknown = JsonBody<paths["/v1/runs/{run_id}/unknown"]["post"]>;
export type DeliverySpec = Schemas["DeliverySpec"];
export type RunAccepted = paths["/v1/runs/{run_id}/complete"]["post"]["responses"][201]["content"]["application/json"];
export type RunAnswer = paths["/v1/runs/{run_id}"]["get"]["responses"][200]["content"]["application/json"];
export type DeliveryAnswer = paths["/v1/deliveries/{key}"]["get"]["responses"][200]["content"]["application/json"];
export type Problem = Schemas["Problem"];

/** The answer to a run event, and whether it is the first answer repeated (a retry). */
export interface Accepted extends Readonly<Omit<RunAccepted, "deliveries">> {
  /** The deliveries the run's transaction carries, with the key each receiver sees. */
  readonly deliveries: readonly Schemas["AcceptedDelivery"][];
  readonly replayed: boolean;
}

/** Any answer but success: its status and the API's one-line error body (`Problem`). */
export class LedgerApiError extends Error {
  constructor(
    readonly status: number,
    readonly problem: Problem,
    readonly request: string,
    readonly retryAfterS?: number,
  ) {
    const field = problem.field ? ` (field ${problem.field})` : "";
    const hint = problem.hint ? `; hint: ${problem.hint}` : "";
    super(`${request}: ${status} ${problem.error}${field}${hint}`);
    this.name = "LedgerApiError";
  }
}

export interface ClientOptions {
  /** The API's base URL, e.g. `http://127.0.0.1:8780`. */
  baseUrl: string;
  /** An API key, `dlk_<key id>_<secret>` (`ledger api-keys create`). */
  apiKey: string;
  /** Per-request timeout in milliseconds (default 30 s). */
  timeoutMs?: number;
  /** A fetch to use instead of the global one. */
  fetch?: typeof fetch;
}

/** A client of one ledger API with one key. Every method is one HTTP request. */
export class LedgerClient {
  readonly baseUrl: string;
  private readonly apiKey: string;
  private readonly timeoutMs: number;
  private readonly fetcher: typeof fetch;

  constructor(options: ClientOptions) {
    if (!options.baseUrl) throw new Error("LedgerClient: baseUrl is required (e.g. http://127.0.0.1:8780)");
    if (!options.apiKey) throw new Error("LedgerClient: apiKey is required (ledger api-keys create)");
    this.baseUrl = options.baseUrl.replace(/\/+$/, "");
    this.apiKey = options.apiKey;
    this.timeoutMs = options.timeoutMs ?? 30_000;
    this.fetcher = options.fetch ?? fetch;
  }

  /** The run succeeded: its result and its deliveries, in one Kafka transaction. */
  completeRun(runId: string, body: CompleteRun): Promise<Accepted> {
    return this.runEvent(runId, "complete", body);
  }

  /** The run began. */
  startRun(runId: string): Promise<Accepted> {
    return this.runEvent(runId, "start", {});
  }

  /** The run failed; no deliveries follow. */
  failRun(runId: string, body: FailRun): Promise<Accepted> {
    return this.runEvent(runId, "fail", body);
  }

  /** Nobody can tell whether the run finished. */
  markRunUnknown(runId: string, body: MarkRunUnknown): Promise<Accepted> {
    return this.runEvent(runId, "unknown", body);
  }

  /** Did the run's execution finish, did each delivery leave, which key the receiver sees. */
  async getRun(runId: string): Promise<RunAnswer> {
    const { body } = await this.request("GET", `/v1/runs/${runPath(runId)}`);
    return body as RunAnswer;
  }

  /** One delivery, by the idempotency key its receiver sees. */
  async getDelivery(key: string): Promise<DeliveryAnswer> {
    const { body } = await this.request("GET", `/v1/deliveries/${encodeURIComponent(key)}`);
    return body as DeliveryAnswer;
  }

  private async runEvent(runId: string, action: string, payload: object): Promise<Accepted> {
    const { body, headers } = await this.request("POST", `/v1/runs/${runPath(runId)}/${action}`, payload);
    const accepted = body as RunAccepted;
    return { ...accepted, deliveries: accepted.deliveries ?? [], replayed: headers.get("idempotent-replayed") === "true" };
  }

  private async request(
    method: string,
    path: string,
    payload?: object,
  ): Promise<{ body: unknown; headers: Headers }> {
    const what = `${method} ${path}`;
    const headers: Record<string, string> = { authorization: `Bearer ${this.apiKey}`, accept: "application/json" };
    if (payload !== undefined) headers["content-type"] = "application/json";
    let response: Response;
    try {
      response = await this.fetcher(this.baseUrl + path, {
        method,
        headers,
        body: payload === undefined ? undefined : JSON.stringify(payload),
        signal: AbortSignal.timeout(this.timeoutMs),
      });
    } catch (error) {
      const why = error instanceof Error ? (error.cause instanceof Error ? error.cause.message : error.message) : String(error);
      throw new Error(
        `${what}: no answer from ${this.baseUrl} (${oneLine(why)}); check that 'ledger api' runs there. ` +
          "A run event may be sent again: the same body gets the first answer",
      );
    }
    const text = await response.text();
    let body: unknown;
    try {
      body = text === "" ? undefined : JSON.parse(text);
    } catch {
      body = undefined;
    }
    if (!response.ok) {
      const problem = isProblem(body) ? body : { error: oneLine(text).slice(0, 200) || response.statusText };
      const retry = Number(response.headers.get("retry-after"));
      throw new LedgerApiError(response.status, problem, what, Number.isFinite(retry) && retry > 0 ? retry : undefined);
    }
    if (body === undefined) {
      throw new Error(`${what}: ${response.status} with a body that is not JSON`);
    }
    return { body, headers: response.headers };
  }
}

/** A run id in a path: run ids may hold '/', which the API's path accepts as it is. */
function runPath(runId: string): string {
  return runId.split("/").map(encodeURIComponent).join("/");
}

function isProblem(body: unknown): body is Problem {
  return typeof body === "object" && body !== null && typeof (body as { error?: unknown }).error === "string";
}

function oneLine(text: string): string {
  return text.split(/\s+/).join(" ").trim();
}
