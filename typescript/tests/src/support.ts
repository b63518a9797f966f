/** What the tests share: the environment pytest gives them, signing as the worker signs. */
import { readFileSync } from "node:fs";
import type { AddressInfo } from "node:net";
import { dirname, join } from "node:path";
import { fileURLToPath } from "node:url";
import { Webhook } from "standardwebhooks";
import {
  createReceiverServer,
  fencingTokenSignature,
  type Handler,
  type IdempotencyStore,
  MemoryStore,
  PostgresStore,
  secretKey,
  WebhookReceiver,
} from "@delivery-ledger/receiver";

export const ROOT = join(dirname(fileURLToPath(import.meta.url)), "..", "..", "..");
// The secret the tests' workers sign with (tests/fixtures/secrets.py), or a local one.
export const SECRET = process.env.LEDGER_WEBHOOK_SECRET ?? "whsec_" + Buffer.alloc(32, 7).toString("base64");

export function readJson(path: string): unknown {
  return JSON.parse(readFileSync(path, "utf8"));
}

/** A store for a test: PostgreSQL when pytest gives one (a table of the test's own), else memory. */
export function testStore(table: string): IdempotencyStore {
  const dsn = process.env.LEDGER_TS_STORE_DSN;
  return dsn ? new PostgresStore(dsn, { table, unavailableAfterMs: 3000, startTimeoutMs: 10_000 }) : new MemoryStore();
}

/** The headers of one signed POST, as the worker sends them (a fencing token when given). */
export function signedHeaders(
  id: string,
  body: string,
  options: { secret?: string; token?: bigint; timestamp?: number } = {},
): Record<string, string> {
  const secret = options.secret ?? SECRET;
  const at = options.timestamp ?? Math.floor(Date.now() / 1000);
  const headers: Record<string, string> = {
    "content-type": "application/json",
    "webhook-id": id,
    "webhook-timestamp": String(at),
    "webhook-signature": new Webhook(secret).sign(id, new Date(at * 1000), body),
  };
  if (options.token !== undefined) {
    headers["fencing-token"] = options.token.toString();
    headers["fencing-token-signature"] = fencingTokenSignature([secretKey(secret)], id, at, options.token);
  }
  return headers;
}

/** A kit on a node:http server, counting what reached it: POSTs and lookups per key, handler runs. */
export class CountingKit {
  readonly posts = new Map<string, number>();
  readonly lookups = new Map<string, number>();
  readonly runs = new Map<string, number>();
  readonly receiver: WebhookReceiver;
  private server: ReturnType<typeof createReceiverServer> | undefined;
  url = "";

  constructor(store: IdempotencyStore, handler: Handler) {
    this.receiver = new WebhookReceiver(
      async (event) => {
        this.runs.set(event.webhookId, (this.runs.get(event.webhookId) ?? 0) + 1);
        return handler(event);
      },
      { secrets: [SECRET], store, handlerLeaseS: 10 },
    );
  }

  async start(port = 0): Promise<void> {
    await this.receiver.start();
    const server = createReceiverServer(this.receiver);
    // Count at the HTTP level, before the kit's dedupe.
    server.prependListener("request", (request) => {
      const id = request.headers["webhook-id"];
      if (request.method === "POST" && typeof id === "string") this.posts.set(id, (this.posts.get(id) ?? 0) + 1);
      const lookup = /\/lookup\/([0-9a-f]+)$/.exec(request.url ?? "");
      if (request.method === "GET" && lookup) {
        const key = lookup[1] as string;
        this.lookups.set(key, (this.lookups.get(key) ?? 0) + 1);
      }
    });
    this.server = server;
    await new Promise<void>((resolve, reject) => {
      server.once("error", reject);
      server.listen(port, "127.0.0.1", () => resolve());
    });
    this.url = `http://127.0.0.1:${(server.address() as AddressInfo).port}`;
  }

  async stop(): Promise<void> {
    const server = this.server;
    if (server !== undefined) {
      server.closeAllConnections();
      await new Promise<void>((resolve) => server.close(() => resolve()));
    }
    await this.receiver.close();
  }
}

/** Poll `check` every `intervalMs` until it is truthy (bounded in time and count), or throw naming `what`. */
export async function waitFor<T>(check: () => Promise<T | undefined | false>, timeoutMs: number, what: string, intervalMs = 300): Promise<T> {
  const deadline = Date.now() + timeoutMs;
  let last: unknown;
  for (let i = 0; i < Math.ceil(timeoutMs / intervalMs) + 2; i++) {
    try {
      const value = await check();
      if (value) return value;
    } catch (error) {
      last = error;
    }
    if (Date.now() > deadline) break;
    await new Promise((resolve) => setTimeout(resolve, intervalMs));
  }
  throw new Error(`timed out after ${timeoutMs} ms waiting for ${what}${last ? `: ${String(last)}` : ""}`);
}
