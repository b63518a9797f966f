/**
 * An idempotency store in this process's memory, for tests and development: one process
 * only, and forgotten on exit (use PostgresStore in production). Node runs one callback
 * at a time and no method awaits between its read and its write, so each is atomic.
 */
import { admit, type Decision, type KeyRecord, type LeaseTerms } from "./records.js";
import type { IdempotencyStore } from "./store.js";

export class MemoryStore implements IdempotencyStore {
  private readonly records = new Map<string, KeyRecord>();

  async start(): Promise<void> {}

  async close(): Promise<void> {}

  async admit(key: string, fencingToken: bigint | null, terms: LeaseTerms): Promise<Decision> {
    const decision = admit(this.records.get(key) ?? null, key, fencingToken, terms);
    this.records.set(key, decision.record);
    return decision;
  }

  async complete(key: string, resultId: string, holder: string): Promise<boolean> {
    return this.settle(key, holder, { status: "done", resultId, error: null });
  }

  async fail(key: string, error: string, holder: string): Promise<boolean> {
    return this.settle(key, holder, { status: "failed", resultId: null, error });
  }

  async renew(key: string, holder: string, expiresAt: number): Promise<boolean> {
    const record = this.records.get(key);
    if (record === undefined || record.leaseHolder !== holder || record.status !== "processing") return false;
    this.records.set(key, { ...record, leaseExpiresAt: Math.max(record.leaseExpiresAt ?? 0, expiresAt) });
    return true;
  }

  async get(key: string): Promise<KeyRecord | null> {
    return this.records.get(key) ?? null;
  }

  private settle(key: string, holder: string, outcome: Pick<KeyRecord, "status" | "resultId" | "error">): boolean {
    const record = this.records.get(key);
    if (record === undefined || record.leaseHolder !== holder || record.status !== "processing") return false;
    this.records.set(key, { ...record, ...outcome });
    return true;
  }
}
