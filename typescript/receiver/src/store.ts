/**
 * The interface every idempotency store implements (the Python kit's receiver/store.py).
 * `admit` must be atomic per key across every process sharing the store; `complete`,
 * `fail` and `renew` are fenced by the run's lease holder.
 */
import type { Decision, KeyRecord, LeaseTerms } from "./records.js";

/** The store's database did not answer in time: nothing was recorded or read. */
export class StoreUnavailable extends Error {
  constructor(message: string) {
    super(message);
    this.name = "StoreUnavailable";
  }
}

export interface IdempotencyStore {
  /** Open connections and create the table if it is missing. */
  start(): Promise<void>;
  /** Release connections. */
  close(): Promise<void>;
  /** Record a request for `key` and decide it (records.admit), atomically. */
  admit(key: string, fencingToken: bigint | null, terms: LeaseTerms): Promise<Decision>;
  /** The handler returned: done with `resultId`, if `holder` still holds the lease. */
  complete(key: string, resultId: string, holder: string): Promise<boolean>;
  /** The handler threw: failed (the next attempt may run it again), if `holder` still holds it. */
  fail(key: string, error: string, holder: string): Promise<boolean>;
  /** The handler is still running: its lease lasts until `expiresAt` (unix seconds). */
  renew(key: string, holder: string, expiresAt: number): Promise<boolean>;
  /** The key's record, or null if no request with it was received. */
  get(key: string): Promise<KeyRecord | null>;
}
