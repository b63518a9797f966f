/**
 * Payload hashes and idempotency keys, computed as the ledger computes them
 * (events/payload_hashes.py, events/keys.py).
 *
 * A payload hash is `jcs-sha256:` + the lowercase hex SHA-256 of the payload's RFC 8785
 * (JCS) canonical JSON. RFC 8785 is the `canonicalize` package (its author's reference
 * implementation for JavaScript): numbers as ECMAScript spells them (1.0 is 1), keys sorted
 * by their UTF-16 code units. Some JSON values have no canonical form: NaN, the infinities,
 * lone surrogates, and integers beyond 2^53 - 1 (JSON.parse rounds those silently, so
 * `parsePayload` checks the literals of a JSON text before anything is parsed).
 */
import { createHash } from "node:crypto";
import canonicalize from "canonicalize";

export const PAYLOAD_HASH_PREFIX = "jcs-sha256:";
export const MAX_EXACT_INTEGER = Number.MAX_SAFE_INTEGER; // 2^53 - 1

/** A payload that has no RFC 8785 form; `field` names where (`payload.items[2].id`). */
export class PayloadHashError extends Error {
  constructor(
    message: string,
    readonly field: string,
  ) {
    super(message);
    this.name = "PayloadHashError";
  }
}

/** The RFC 8785 canonical JSON of `payload`, as UTF-8 bytes. */
export function canonicalJson(payload: unknown, where = "payload"): Buffer {
  const problem = refusal(payload, where);
  if (problem !== undefined) {
    throw new PayloadHashError(problem.why, problem.field);
  }
  const text = canonicalize(payload);
  if (text === undefined) {
    throw new PayloadHashError(`${where} has no JSON form (undefined)`, where);
  }
  return Buffer.from(text, "utf8");
}

/** `jcs-sha256:` + hex SHA-256 of the payload's RFC 8785 JSON: what the ledger stores. */
export function payloadHash(payload: unknown): string {
  const digest = createHash("sha256").update(canonicalJson(payload)).digest("hex");
  return PAYLOAD_HASH_PREFIX + digest;
}

/** The key a delivery is known by at its receiver: sha256 of `run:event_type:channel:recipient`. */
export function idempotencyKey(
  runId: string,
  eventType: string,
  channel: string,
  recipient: string,
): string {
  return createHash("sha256")
    .update(`${runId}:${eventType}:${channel}:${recipient}`, "utf8")
    .digest("hex");
}

/**
 * A JSON text parsed as a payload, refusing an integer literal beyond 2^53 - 1 (which
 * JSON.parse would round to another number, and so to another hash) with the field it is in.
 */
export function parsePayload(text: string, where = "payload"): unknown {
  const value: unknown = JSON.parse(text);
  const big = firstInexactInteger(text);
  if (big !== undefined) {
    const field = fieldOfLiteral(value, big.literal, where) ?? where;
    throw new PayloadHashError(
      `${field} is ${big.literal}, beyond the exact integer range of RFC 8785 (JCS) JSON, ` +
        "+-(2**53 - 1): send it as a string",
      field,
    );
  }
  return value;
}

type Refusal = { why: string; field: string };

/** Why `payload` has no RFC 8785 form, naming the first field at fault (iterative). */
function refusal(payload: unknown, where: string): Refusal | undefined {
  const stack: Array<[string, unknown]> = [[where, payload]];
  for (let budget = 0; stack.length > 0 && budget < 10_000_000; budget++) {
    const [path, item] = stack.pop() as [string, unknown];
    if (typeof item === "number") {
      if (!Number.isFinite(item)) {
        return { why: `${path} is ${item}: RFC 8785 (JCS) JSON has no NaN or Infinity`, field: path };
      }
    } else if (typeof item === "string") {
      if (!item.isWellFormed()) {
        return { why: `${path} holds a lone surrogate (not encodable as UTF-8)`, field: path };
      }
    } else if (typeof item === "bigint") {
      return { why: `${path} is a bigint: send it as a string`, field: path };
    } else if (Array.isArray(item)) {
      for (let i = item.length - 1; i >= 0; i--) stack.push([`${path}[${i}]`, item[i]]);
    } else if (item !== null && typeof item === "object") {
      const entries = Object.entries(item as Record<string, unknown>);
      for (let i = entries.length - 1; i >= 0; i--) {
        const [name, child] = entries[i] as [string, unknown];
        if (!name.isWellFormed()) {
          return { why: `${path} has a key that is not a UTF-8 string`, field: path };
        }
        stack.push([`${path}.${name}`, child]);
      }
    }
  }
  return undefined;
}

/** The first integer literal (no fraction, no exponent) of a JSON text beyond 2^53 - 1. */
function firstInexactInteger(text: string): { literal: string } | undefined {
  let i = 0;
  while (i < text.length) {
    const c = text[i] as string;
    if (c === '"') {
      i++;
      while (i < text.length && text[i] !== '"') i += text[i] === "\\" ? 2 : 1;
      i++;
    } else if (c === "-" || (c >= "0" && c <= "9")) {
      const start = i;
      i++;
      while (i < text.length && /[0-9.eE+-]/.test(text[i] as string)) i++;
      const literal = text.slice(start, i);
      if (/^-?[0-9]+$/.test(literal) && BigInt(literal.replace("-", "")) > BigInt(MAX_EXACT_INTEGER)) {
        return { literal };
      }
    } else {
      i++;
    }
  }
  return undefined;
}

/** The path of the first number in `value` equal to `literal` (as JSON.parse read it). */
function fieldOfLiteral(value: unknown, literal: string, where: string): string | undefined {
  const wanted = Number(literal);
  const stack: Array<[string, unknown]> = [[where, value]];
  while (stack.length > 0) {
    const [path, item] = stack.pop() as [string, unknown];
    if (typeof item === "number" && item === wanted) return path;
    if (Array.isArray(item)) {
      for (let i = item.length - 1; i >= 0; i--) stack.push([`${path}[${i}]`, item[i]]);
    } else if (item !== null && typeof item === "object") {
      const entries = Object.entries(item as Record<string, unknown>).reverse();
      for (const [name, child] of entries) stack.push([`${path}.${name}`, child]);
    }
  }
  return undefined;
}
