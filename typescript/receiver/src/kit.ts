/**
 * The receiver's side of the protocol, framework-neutral (the Python kit's receiver/kit.py):
 * verify, record at receipt, run the handler once per idempotency key, refuse stale
 * fencing tokens, answer the lookup the ledger settles UNKNOWN deliveries with.
 *
 * `receive(headers, body, route)` returns a Reply (status, JSON body, headers) that a
 * server writes out (`createReceiverServer` in server.ts, or your framework). The key is
 * recorded before the handler runs, so a lookup never says "not found" about a request
 * being processed. The run holds a handler lease on the key, renewed every third of
 * `handlerLeaseS` while the handler runs; a key whose run died (the lease ran out) is run
 * again if `idempotentHandler` is declared, else it is `stuck` for an operator
 * (docs/LOOKUP_CONTRACT.md).
 */
import { randomUUID } from "node:crypto";
import {
  FENCING_TOKEN_HEADER,
  type Headerish,
  header,
  LOOKUP_HTTP_STATUS,
  type LookupStatus,
  lookupAnswer,
  parseFencingToken,
} from "./contract.js";
import { type KeyRecord, type LeaseTerms, leaseExpired } from "./records.js";
import { type IdempotencyStore, StoreUnavailable } from "./store.js";
import { SignatureVerifier } from "./verification.js";

export const MAX_BODY_BYTES = 1024 * 1024;
export const RETRY_AFTER_S = 5;
export const HEADER_TIMEOUT_S = 10;
export const HANDLER_LEASE_S = 30;
const MAX_POLLS = 1000;

/** One verified request, as the handler sees it. */
export interface ReceivedWebhook {
  /** The idempotency key. */
  readonly webhookId: string;
  readonly timestamp: number;
  /** The JSON body, parsed. */
  readonly payload: unknown;
  readonly body: Buffer;
  readonly fencingToken: bigint | null;
  /** The path below the prefix (`/hooks/{route}`), "" for the prefix. */
  readonly route: string;
}

/** Returns the id of what it made (an order id, a ticket id): the lookup's `id`. */
export type Handler = (event: ReceivedWebhook) => Promise<string> | string;

export interface Reply {
  readonly status: number;
  readonly body: Record<string, unknown>;
  readonly headers?: Readonly<Record<string, string>>;
}

export interface ReceiverOptions {
  /** The endpoint's Standard Webhooks secrets (`whsec_...`), several during a rotation. */
  secrets: readonly string[];
  store: IdempotencyStore;
  /** How far a timestamp may be from now (default 300 s). */
  toleranceS?: number;
  /** How long a request for a key another request is running waits for its answer (2 s). */
  inProgressWaitS?: number;
  /** How long a run that stops renewing (it died) keeps its key (30 s). */
  handlerLeaseS?: number;
  /** Is running the handler twice for one key harmless? (default false: a dead run's key is stuck). */
  idempotentHandler?: boolean;
  /** Unix seconds now (for tests). */
  clock?: () => number;
  /** Where the kit logs (default console). */
  log?: Pick<Console, "warn" | "error">;
}

export class WebhookReceiver {
  readonly verifier: SignatureVerifier;
  readonly store: IdempotencyStore;
  readonly idempotentHandler: boolean;
  private readonly leaseS: number;
  private readonly waitS: number;
  private readonly clock: () => number;
  private readonly log: Pick<Console, "warn" | "error">;
  private readonly instance = `${process.pid}-${randomUUID().slice(0, 8)}`;
  private readonly settled = new Map<string, Promise<void>>();

  constructor(
    private readonly handler: Handler,
    options: ReceiverOptions,
  ) {
    const leaseS = options.handlerLeaseS ?? HANDLER_LEASE_S;
    if (!(leaseS > 0)) throw new Error("handlerLeaseS must be a positive number of seconds");
    this.leaseS = leaseS;
    this.idempotentHandler = options.idempotentHandler ?? false;
    this.verifier = new SignatureVerifier(options.secrets, options.toleranceS);
    this.store = options.store;
    this.waitS = options.inProgressWaitS ?? 2;
    this.clock = options.clock ?? (() => Date.now() / 1000);
    this.log = options.log ?? console;
  }

  start(): Promise<void> {
    return this.store.start();
  }

  close(): Promise<void> {
    return this.store.close();
  }

  /** One POST: 401 bad signature (body or token), 400 bad body or token, 409 stale token, else the answer. */
  async receive(headers: Headerish, body: Buffer, route = ""): Promise<Reply> {
    const problem = this.verifier.problem(headers, body, this.clock());
    if (problem !== undefined) return { status: 401, body: { error: "invalid webhook signature", detail: problem } };
    const key = header(headers, "webhook-id");
    let payload: unknown;
    try {
      payload = JSON.parse(body.toString("utf8"));
    } catch {
      return { status: 400, body: { error: "the body is not JSON", webhook_id: key } };
    }
    const rawToken = headers[FENCING_TOKEN_HEADER] === undefined ? undefined : header(headers, FENCING_TOKEN_HEADER);
    let token: bigint | null = null;
    if (rawToken !== undefined) {
      try {
        token = parseFencingToken(rawToken);
      } catch (error) {
        return { status: 400, body: { error: (error as Error).message, webhook_id: key } };
      }
      // Unsigned, a token is anyone's to raise: a replay with 2^63-1 would fence out every genuine retry.
      if (!this.verifier.tokenVerified(headers, token)) {
        return {
          status: 401,
          body: {
            error: "invalid fencing token signature",
            detail:
              "fencing-token-signature is missing or does not sign this token for this webhook-id " +
              "and timestamp with any of our secrets",
            webhook_id: key,
          },
        };
      }
    }
    const terms: LeaseTerms = {
      holder: `${this.instance}-${randomUUID().replaceAll("-", "").slice(0, 12)}`,
      now: this.clock(),
      leaseS: this.leaseS,
      idempotentHandler: this.idempotentHandler,
    };
    let decision;
    try {
      decision = await this.store.admit(key, token, terms);
    } catch (error) {
      if (error instanceof StoreUnavailable) return unavailable(key, error);
      throw error;
    }
    switch (decision.admission) {
      case "stale":
        return {
          status: 409,
          body: {
            error: "stale fencing token",
            detail:
              `fencing token ${token} is older than ${decision.seenToken}, already seen for webhook-id ` +
              `${key}; this attempt was superseded`,
            webhook_id: key,
          },
        };
      case "duplicate":
        return done(key, decision.record.resultId, true);
      case "stuck":
        return stuck(key);
      case "in_progress":
        try {
          return await this.awaitFirst(key);
        } catch (error) {
          if (error instanceof StoreUnavailable) return unavailable(key, error);
          throw error;
        }
      case "run":
        break;
    }
    if (decision.reclaimed) {
      this.log.warn(
        `webhook-id ${key}: the run holding it stopped renewing its lease (it died); running the idempotent handler again`,
      );
    }
    const event: ReceivedWebhook = {
      webhookId: key,
      timestamp: Number(header(headers, "webhook-timestamp")),
      payload,
      body,
      fencingToken: token,
      route: route.replace(/^\/+|\/+$/g, ""),
    };
    return this.run(event, terms.holder);
  }

  private async run(event: ReceivedWebhook, holder: string): Promise<Reply> {
    const key = event.webhookId;
    let release!: () => void;
    this.settled.set(key, new Promise<void>((resolve) => (release = resolve)));
    const heartbeat = setInterval(() => void this.renew(key, holder, heartbeat), (this.leaseS / 3) * 1000);
    try {
      let resultId: string;
      try {
        resultId = String(await this.handler(event));
      } catch (error) {
        // The error's text may hold anything (even secrets): logged, its type answered.
        const kind = error instanceof Error ? error.name : typeof error;
        this.log.error(`handler failed for webhook-id ${key}:`, error);
        clearInterval(heartbeat);
        await this.store.fail(key, kind, holder).catch(() => {}); // unreachable: the key stays "processing"
        return {
          status: 500,
          body: { error: `the handler failed (${kind}); the next attempt runs it again`, webhook_id: key },
        };
      }
      clearInterval(heartbeat);
      try {
        if (!(await this.store.complete(key, resultId, holder))) {
          this.log.error(
            `webhook-id ${key}: the handler returned after its lease was reclaimed by another run; ` +
              `this run's result ${resultId} is not recorded`,
          );
        }
      } catch (error) {
        if (!(error instanceof StoreUnavailable)) throw error;
        // The handler ran: say so. The key stays "processing" (a retry waits, a lookup says 202).
        this.log.error(`could not record the result of webhook-id ${key}: the store is unreachable`);
      }
      return done(key, resultId, false);
    } finally {
      clearInterval(heartbeat);
      release();
      this.settled.delete(key);
    }
  }

  private async renew(key: string, holder: string, heartbeat: NodeJS.Timeout): Promise<void> {
    try {
      if (!(await this.store.renew(key, holder, this.clock() + this.leaseS))) {
        clearInterval(heartbeat);
        this.log.warn(
          `webhook-id ${key}: this run's handler lease ran out and the key was reclaimed; its outcome will not be recorded`,
        );
      }
    } catch {
      this.log.warn(`could not renew the handler lease of webhook-id ${key}`);
    }
  }

  /** Another request is running the handler: wait (bounded) for its answer. */
  private async awaitFirst(key: string): Promise<Reply> {
    const deadline = Date.now() + this.waitS * 1000;
    let pause = 50;
    for (let poll = 0; poll < MAX_POLLS; poll++) {
      const record = await this.store.get(key);
      if (record !== null && record.status === "done") return done(key, record.resultId, true);
      const remaining = deadline - Date.now();
      if (record === null || record.status !== "processing" || remaining <= 0) break;
      const local = this.settled.get(key);
      if (local !== undefined) {
        await Promise.race([local, sleep(remaining)]);
      } else {
        await sleep(Math.min(remaining, pause));
        pause = Math.min(pause * 2, 1000);
      }
    }
    return {
      status: 409,
      body: { status: "processing", error: "a request with this webhook-id is still being processed", webhook_id: key },
      headers: { "retry-after": "1" },
    };
  }

  /** The lookup contract: 401 unless signed with one of our secrets and fresh; then the answer. */
  async lookup(key: string, headers: Headerish): Promise<Reply> {
    const now = this.clock();
    const problem = this.verifier.lookupProblem(headers, key, now);
    if (problem !== undefined) return { status: 401, body: { error: "invalid lookup signature", detail: problem } };
    try {
      return lookupReply(await this.store.get(key), key, now, this.idempotentHandler);
    } catch (error) {
      if (error instanceof StoreUnavailable) return unavailable(key, error);
      throw error;
    }
  }
}

/** The lookup contract's answer for a key's record (already authenticated). */
export function lookupReply(record: KeyRecord | null, key: string, now: number, idempotentHandler: boolean): Reply {
  let status: LookupStatus;
  if (record === null) status = "not_found";
  else if (leaseExpired(record, now)) status = idempotentHandler ? "failed" : "stuck";
  else if (record.status === "processing") status = "processing";
  else if (record.status === "failed") status = "failed";
  else status = "done";
  return { status: LOOKUP_HTTP_STATUS[status], body: { ...lookupAnswer(status, key, record?.resultId ?? null) } };
}

function unavailable(key: string, error: StoreUnavailable): Reply {
  return {
    status: 503,
    body: { error: "the idempotency store is unavailable; try again", detail: error.message, webhook_id: key },
    headers: { "retry-after": String(RETRY_AFTER_S) },
  };
}

function stuck(key: string): Reply {
  return {
    status: 409,
    body: {
      status: "stuck",
      error:
        "the handler for this webhook-id died while processing it and is not declared idempotent: " +
        "it is not run again; an operator settles this key",
      webhook_id: key,
    },
  };
}

function done(key: string, resultId: string | null, duplicate: boolean): Reply {
  return { status: 200, body: { id: resultId, webhook_id: key, duplicate } };
}

function sleep(ms: number): Promise<void> {
  return new Promise((resolve) => setTimeout(resolve, Math.max(0, ms)));
}
