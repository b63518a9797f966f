/**
 * The PostgreSQL idempotency store (npm `pg`), for receivers on several hosts: the same
 * table, columns and statements as the Python kit's receiver/postgres.py, so a TypeScript
 * and a Python receiver may share one table.
 *
 * The key's row is inserted if missing and then locked (`FOR UPDATE`) in one transaction:
 * the read, the decision and the write of one admission are one step for every process.
 * A database that restarts or drops connections does not stop the receiver: each call is
 * tried again with capped, jittered backoff for up to `unavailableAfterMs`, then rejects
 * with StoreUnavailable (the kit answers 503 and runs nothing). A retried admission that
 * had committed before its answer was lost is recognised by its own mark (`admitted_by`).
 */
import pg from "pg";
import { admit, type Decision, type KeyRecord, type KeyStatus, type LeaseTerms } from "./records.js";
import { type IdempotencyStore, StoreUnavailable } from "./store.js";

export interface PostgresStoreOptions {
  /** The table (default `receiver_keys`, the Python kit's). */
  table?: string;
  /** Connections in the pool (default 8). */
  maxConnections?: number;
  /** How long a call keeps trying a database that does not answer (default 5000 ms). */
  unavailableAfterMs?: number;
  /** How long start() waits for a server that is not up yet (default 30000 ms). */
  startTimeoutMs?: number;
}

const COLUMNS = "status, fencing_token, result_id, error, lease_holder, lease_expires_at";
const MAX_ATTEMPTS = 1000;
// The server's own failures (class 08 connection, 57P0x shutting down or starting up) and
// the socket's: worth another attempt. Anything else is a bug or a configuration error.
const TRANSIENT_CODES = new Set(["ECONNREFUSED", "ECONNRESET", "EPIPE", "ETIMEDOUT", "ENOTFOUND", "EAI_AGAIN"]);
const CONFIG_CODES = new Set(["28P01", "28000", "3D000", "42501"]);

type Row = {
  status: KeyStatus;
  fencing_token: string | null;
  result_id: string | null;
  error: string | null;
  lease_holder: string | null;
  lease_expires_at: number | null;
  admitted_by?: string | null;
};

export class PostgresStore implements IdempotencyStore {
  private readonly pool: pg.Pool;
  private readonly table: string;
  private readonly budgetMs: number;
  private readonly startTimeoutMs: number;
  private down = false;

  constructor(connectionString: string, options: PostgresStoreOptions = {}) {
    this.table = options.table ?? "receiver_keys";
    if (!/^[a-z_][a-z0-9_]{0,62}$/.test(this.table)) {
      throw new Error(`PostgresStore: table ${JSON.stringify(this.table)} is not a lowercase SQL identifier`);
    }
    this.budgetMs = options.unavailableAfterMs ?? 5_000;
    this.startTimeoutMs = options.startTimeoutMs ?? 30_000;
    this.pool = new pg.Pool({
      connectionString,
      max: options.maxConnections ?? 8,
      connectionTimeoutMillis: Math.max(1_000, this.budgetMs),
    });
    // An idle connection the server closed (a restart): dropped by the pool, not fatal.
    this.pool.on("error", () => {});
  }

  async start(): Promise<void> {
    const table = this.table;
    await this.attempt(async (client) => {
      await client.query("BEGIN");
      try {
        await client.query("SELECT pg_advisory_xact_lock(7411)");
        await client.query(
          `CREATE TABLE IF NOT EXISTS ${table} (key TEXT PRIMARY KEY, status TEXT NOT NULL, ` +
            "fencing_token BIGINT, result_id TEXT, error TEXT, admitted_by TEXT, " +
            "lease_holder TEXT, lease_expires_at DOUBLE PRECISION)",
        );
        for (const column of ["admitted_by TEXT", "lease_holder TEXT", "lease_expires_at DOUBLE PRECISION"]) {
          await client.query(`ALTER TABLE ${table} ADD COLUMN IF NOT EXISTS ${column}`);
        }
        await client.query("COMMIT");
      } catch (error) {
        await client.query("ROLLBACK").catch(() => {});
        throw error;
      }
    }, this.startTimeoutMs);
  }

  async close(): Promise<void> {
    await this.pool.end();
  }

  async admit(key: string, fencingToken: bigint | null, terms: LeaseTerms): Promise<Decision> {
    const mark = terms.holder; // this admission's, the same in every retry of it
    const table = this.table;
    return this.attempt(async (client) => {
      await client.query("BEGIN");
      try {
        const decision = await this.admitIn(client, table, key, fencingToken, terms, mark);
        await client.query("COMMIT");
        return decision;
      } catch (error) {
        await client.query("ROLLBACK").catch(() => {});
        throw error;
      }
    });
  }

  private async admitIn(
    client: pg.PoolClient,
    table: string,
    key: string,
    token: bigint | null,
    terms: LeaseTerms,
    mark: string,
  ): Promise<Decision> {
    const first = admit(null, key, token, terms);
    const inserted = await client.query(
      `INSERT INTO ${table} (key, status, fencing_token, admitted_by, lease_holder, lease_expires_at) ` +
        "VALUES ($1, $2, $3, $4, $5, $6) ON CONFLICT (key) DO NOTHING RETURNING key",
      [key, first.record.status, token?.toString() ?? null, mark, first.record.leaseHolder, first.record.leaseExpiresAt],
    );
    if (inserted.rowCount === 1) return first;
    const found = await client.query<Row>(
      `SELECT ${COLUMNS}, admitted_by FROM ${table} WHERE key = $1 FOR UPDATE`,
      [key],
    );
    const row = found.rows[0];
    const existing = record(key, row);
    if (row !== undefined && existing !== null && row.admitted_by === mark) {
      return { admission: "run", record: existing }; // this admission committed before its answer was lost
    }
    const decision = admit(existing, key, token, terms);
    const next = decision.record;
    await client.query(
      `UPDATE ${table} SET status = $1, fencing_token = $2, result_id = $3, error = $4, ` +
        "lease_holder = $5, lease_expires_at = $6, " +
        "admitted_by = CASE WHEN $7::boolean THEN $8 ELSE admitted_by END WHERE key = $9",
      [
        next.status,
        next.fencingToken?.toString() ?? null,
        next.resultId,
        next.error,
        next.leaseHolder,
        next.leaseExpiresAt,
        decision.admission === "run",
        mark,
        key,
      ],
    );
    return decision;
  }

  complete(key: string, resultId: string, holder: string): Promise<boolean> {
    return this.settle(key, holder, "done", resultId, null);
  }

  fail(key: string, error: string, holder: string): Promise<boolean> {
    return this.settle(key, holder, "failed", null, error);
  }

  async renew(key: string, holder: string, expiresAt: number): Promise<boolean> {
    return this.attempt(async (client) => {
      const result = await client.query(
        `UPDATE ${this.table} SET lease_expires_at = GREATEST(COALESCE(lease_expires_at, 0), $1) ` +
          "WHERE key = $2 AND lease_holder = $3 AND status = 'processing'",
        [expiresAt, key, holder],
      );
      return result.rowCount === 1;
    });
  }

  async get(key: string): Promise<KeyRecord | null> {
    return this.attempt(async (client) => {
      const result = await client.query<Row>(`SELECT ${COLUMNS} FROM ${this.table} WHERE key = $1`, [key]);
      return record(key, result.rows[0]);
    });
  }

  private async settle(
    key: string,
    holder: string,
    status: KeyStatus,
    resultId: string | null,
    error: string | null,
  ): Promise<boolean> {
    // The handler has run: its outcome is worth a longer wait than a new request.
    const changed = await this.attempt(async (client) => {
      const result = await client.query(
        `UPDATE ${this.table} SET status = $1, result_id = $2, error = $3 ` +
          "WHERE key = $4 AND lease_holder = $5 AND status = 'processing'",
        [status, resultId, error, key, holder],
      );
      return result.rowCount === 1;
    }, 3 * this.budgetMs);
    if (changed) return true;
    // A retried UPDATE that had committed finds the key settled already: by this holder.
    const now = await this.get(key);
    return now !== null && now.leaseHolder === holder && now.status === status;
  }

  /** `work` on a pooled connection; on the database's own failure, again after a backoff. */
  private async attempt<T>(work: (client: pg.PoolClient) => Promise<T>, budgetMs = this.budgetMs): Promise<T> {
    const deadline = Date.now() + budgetMs;
    let delay = 50;
    for (let attempt = 0; attempt < MAX_ATTEMPTS; attempt++) {
      let client: pg.PoolClient | undefined;
      try {
        client = await this.pool.connect();
        const result = await work(client);
        client.release();
        if (this.down) {
          this.down = false;
          console.warn("receiver idempotency store (PostgreSQL): reachable again");
        }
        return result;
      } catch (error) {
        client?.release(true); // a connection that failed is not reused
        if (!transient(error)) {
          if (configuration(error)) {
            throw new Error(`receiver store: ${reason(error)} (check the connection string: user, password, database)`);
          }
          throw error;
        }
        if (!this.down) {
          this.down = true;
          console.warn(`receiver idempotency store (PostgreSQL) unreachable: ${reason(error)}; retrying`);
        }
        const pause = attempt === 0 ? 0 : delay * (0.5 + Math.random() / 2);
        delay = Math.min(delay * 2, 1_000);
        if (Date.now() + pause >= deadline) {
          throw new StoreUnavailable(`idempotency store unreachable: ${reason(error)}`);
        }
        await new Promise((resolve) => setTimeout(resolve, pause));
      }
    }
    throw new StoreUnavailable("idempotency store unreachable: too many attempts");
  }
}

function record(key: string, row: Row | undefined): KeyRecord | null {
  if (row === undefined) return null;
  return {
    key,
    status: row.status,
    fencingToken: row.fencing_token === null ? null : BigInt(row.fencing_token),
    resultId: row.result_id,
    error: row.error,
    leaseHolder: row.lease_holder,
    leaseExpiresAt: row.lease_expires_at,
  };
}

function codeOf(error: unknown): string {
  return typeof error === "object" && error !== null && "code" in error ? String(error.code) : "";
}

function transient(error: unknown): boolean {
  const code = codeOf(error);
  if (TRANSIENT_CODES.has(code) || code.startsWith("08") || code.startsWith("57P")) return true;
  const message = error instanceof Error ? error.message : "";
  // pg's own words for a connection that went away or never came.
  return /Connection terminated|timeout exceeded when trying to connect|Client has encountered a connection error/i.test(
    message,
  );
}

function configuration(error: unknown): boolean {
  return CONFIG_CODES.has(codeOf(error));
}

function reason(error: unknown): string {
  const text = error instanceof Error ? error.message : String(error);
  return text.split(/\s+/).join(" ").slice(0, 200);
}
