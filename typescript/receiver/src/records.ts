/**
 * What the receiver remembers per idempotency key, and the one decision made on receipt:
 * the Python kit's receiver/records.py, rule for rule, so both kits decide alike (and can
 * share one PostgreSQL table). Pure: no I/O, no clock (`now` is in the LeaseTerms).
 */

export type KeyStatus = "processing" | "done" | "failed";

export interface KeyRecord {
  readonly key: string;
  readonly status: KeyStatus;
  /** The highest fencing token seen for this key (null: none sent). */
  readonly fencingToken: bigint | null;
  readonly resultId: string | null;
  readonly error: string | null;
  /** The run that holds the handler lease. */
  readonly leaseHolder: string | null;
  /** Unix seconds; null: written without a lease. */
  readonly leaseExpiresAt: number | null;
}

/** What one request asks for if it gets to run the handler: the lease it would hold. */
export interface LeaseTerms {
  readonly holder: string;
  readonly now: number; // unix seconds
  readonly leaseS: number;
  readonly idempotentHandler: boolean;
}

export type Admission = "run" | "duplicate" | "in_progress" | "stale" | "stuck";

export interface Decision {
  readonly admission: Admission;
  /** The record as it must be stored after the decision. */
  readonly record: KeyRecord;
  /** For "stale": the newer token already seen. */
  readonly seenToken?: bigint | null;
  /** For "run": the key's previous run died holding the lease. */
  readonly reclaimed?: boolean;
}

/** True if `record` is processing and its handler's lease has run out: the run died. */
export function leaseExpired(record: KeyRecord, now: number): boolean {
  if (record.status !== "processing") return false;
  return record.leaseExpiresAt === null || record.leaseExpiresAt <= now;
}

function newest(seen: bigint | null, token: bigint | null): bigint | null {
  if (seen === null) return token;
  if (token === null) return seen;
  return token > seen ? token : seen;
}

function leased(key: string, token: bigint | null, terms: LeaseTerms): KeyRecord {
  return {
    key,
    status: "processing",
    fencingToken: token,
    resultId: null,
    error: null,
    leaseHolder: terms.holder,
    leaseExpiresAt: terms.now + terms.leaseS,
  };
}

/** Decide a request for `key` carrying fencing `token` (null: no fencing header). */
export function admit(
  existing: KeyRecord | null,
  key: string,
  token: bigint | null,
  terms: LeaseTerms,
): Decision {
  if (existing === null) return { admission: "run", record: leased(key, token, terms) };
  const seen = existing.fencingToken;
  if (token !== null && seen !== null && token < seen) {
    return { admission: "stale", record: existing, seenToken: seen };
  }
  const top = newest(seen, token);
  if (existing.status === "failed") return { admission: "run", record: leased(key, top, terms) };
  const expired = leaseExpired(existing, terms.now);
  if (expired && terms.idempotentHandler) {
    return { admission: "run", record: leased(key, top, terms), reclaimed: true };
  }
  const kept: KeyRecord = { ...existing, fencingToken: top };
  if (existing.status === "done") return { admission: "duplicate", record: kept };
  if (expired) return { admission: "stuck", record: kept };
  return { admission: "in_progress", record: kept };
}
