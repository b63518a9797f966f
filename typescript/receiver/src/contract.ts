/**
 * What the ledger's worker and a receiver agree on beyond Standard Webhooks (the Python
 * side's events/contract.py): the fencing token and its signature, the signed lookup, the
 * lookup's statuses and answer. Both extra signatures are HMAC-SHA256 under a key derived
 * from the endpoint's Standard Webhooks secret, one key per purpose:
 *
 *   purpose_key = HMAC-SHA256(secret_bytes, "delivery-ledger/" + purpose)
 *   fencing-token-signature: v1,base64(HMAC(purpose_key("fencing-token"), "<webhook-id>.<webhook-timestamp>.<token>"))
 *   lookup-signature:        v1,base64(HMAC(purpose_key("lookup"), "<key>.<lookup-timestamp>"))
 */
import { createHmac, timingSafeEqual } from "node:crypto";

export const FENCING_TOKEN_HEADER = "fencing-token";
export const FENCING_TOKEN_SIGNATURE_HEADER = "fencing-token-signature";
export const LOOKUP_TIMESTAMP_HEADER = "lookup-timestamp";
export const LOOKUP_SIGNATURE_HEADER = "lookup-signature";
export const MIN_SECRET_BYTES = 24;
export const MAX_FENCING_TOKEN = 2n ** 63n - 1n;
const MAX_TOKEN_DIGITS = MAX_FENCING_TOKEN.toString().length;

export type LookupStatus = "done" | "processing" | "not_found" | "failed" | "stuck";

export const LOOKUP_HTTP_STATUS: Readonly<Record<LookupStatus, number>> = {
  done: 200,
  processing: 202,
  not_found: 404,
  failed: 404,
  stuck: 409,
};

export interface LookupAnswer {
  status: LookupStatus;
  webhook_id: string;
  id?: string | null;
}

export function lookupAnswer(status: LookupStatus, key: string, resultId: string | null = null): LookupAnswer {
  const answer: LookupAnswer = { status, webhook_id: key };
  if (status === "done") answer.id = resultId;
  return answer;
}

/** The key bytes of a `whsec_` secret, read as standardwebhooks reads it; throws (never echoing it). */
export function secretKey(secret: string): Buffer {
  const encoded = secret.startsWith("whsec_") ? secret.slice("whsec_".length) : secret;
  if (!/^[A-Za-z0-9+/]*={0,2}$/.test(encoded)) {
    throw new Error("webhook secret is not 'whsec_' followed by base64");
  }
  const key = Buffer.from(encoded, "base64");
  if (key.length === 0) throw new Error("webhook secret is empty");
  if (key.length < MIN_SECRET_BYTES) {
    throw new Error(
      `webhook secret is ${key.length} bytes; at least ${MIN_SECRET_BYTES} are required ` +
        "(Standard Webhooks recommends 24 to 64 random bytes)",
    );
  }
  return key;
}

/** A fencing-token header as an integer in 0..2^63-1; throws saying why not. */
export function parseFencingToken(raw: string): bigint {
  const text = raw.trim();
  if (!text || text.length > MAX_TOKEN_DIGITS || !/^[0-9]+$/.test(text)) {
    throw new Error(`${FENCING_TOKEN_HEADER} must be a non-negative integer of at most ${MAX_TOKEN_DIGITS} digits`);
  }
  const token = BigInt(text);
  if (token > MAX_FENCING_TOKEN) throw new Error(`${FENCING_TOKEN_HEADER} must be at most 2^63-1`);
  return token;
}

function purposeKey(key: Buffer, purpose: string): Buffer {
  return createHmac("sha256", key).update(`delivery-ledger/${purpose}`).digest();
}

function sign(keys: readonly Buffer[], purpose: string, message: string): string[] {
  if (keys.length === 0) throw new Error("no webhook secret to sign with");
  return keys.map((key) => createHmac("sha256", purposeKey(key, purpose)).update(message).digest("base64"));
}

function matches(keys: readonly Buffer[], purpose: string, message: string, header: string): boolean {
  const offered = header
    .split(" ")
    .map((entry) => entry.split(","))
    .filter(([version, signature]) => version === "v1" && signature)
    .map(([, signature]) => Buffer.from(signature as string));
  for (const expected of sign(keys, purpose, message)) {
    const mac = Buffer.from(expected);
    if (offered.some((each) => each.length === mac.length && timingSafeEqual(each, mac))) return true;
  }
  return false;
}

/** The `fencing-token-signature` value for one attempt, one entry per key. */
export function fencingTokenSignature(keys: readonly Buffer[], webhookId: string, timestamp: number | string, token: bigint | number): string {
  return sign(keys, "fencing-token", `${webhookId}.${timestamp}.${token}`).map((s) => `v1,${s}`).join(" ");
}

export function fencingTokenVerified(keys: readonly Buffer[], headers: Headerish, token: bigint): boolean {
  const signature = header(headers, FENCING_TOKEN_SIGNATURE_HEADER);
  const message = `${header(headers, "webhook-id")}.${header(headers, "webhook-timestamp")}.${token}`;
  return signature !== "" && matches(keys, "fencing-token", message, signature);
}

/** The headers that authenticate a lookup of `key` at `timestamp` (unix seconds). */
export function lookupHeaders(keys: readonly Buffer[], key: string, timestamp: number): Record<string, string> {
  return {
    [LOOKUP_TIMESTAMP_HEADER]: String(timestamp),
    [LOOKUP_SIGNATURE_HEADER]: sign(keys, "lookup", `${key}.${timestamp}`).map((s) => `v1,${s}`).join(" "),
  };
}

/** Undefined if the lookup of `key` is signed by one of `keys` and fresh; else why not. */
export function lookupProblem(
  keys: readonly Buffer[],
  headers: Headerish,
  key: string,
  now: number,
  toleranceS: number,
): string | undefined {
  const timestamp = header(headers, LOOKUP_TIMESTAMP_HEADER);
  const signature = header(headers, LOOKUP_SIGNATURE_HEADER);
  if (!timestamp || !signature) return `missing ${LOOKUP_TIMESTAMP_HEADER} or ${LOOKUP_SIGNATURE_HEADER} header`;
  if (!/^[0-9]{1,12}$/.test(timestamp)) return `${LOOKUP_TIMESTAMP_HEADER} is not unix seconds`;
  const away = Math.abs(now - Number(timestamp));
  if (away > toleranceS) {
    return (
      `${LOOKUP_TIMESTAMP_HEADER} ${timestamp} is ${away.toFixed(0)}s away from now, outside the ` +
      `${toleranceS.toFixed(0)}s tolerance (check the sender's clock)`
    );
  }
  if (!matches(keys, "lookup", `${key}.${timestamp}`, signature)) {
    return "no v1 lookup signature matches any of the receiver's secrets";
  }
  return undefined;
}

/** Request headers: lower-case names, as node:http gives them (a repeated one joined). */
export type Headerish = Readonly<Record<string, string | string[] | undefined>>;

export function header(headers: Headerish, name: string): string {
  const value = headers[name];
  return Array.isArray(value) ? value.join(", ") : (value ?? "");
}
