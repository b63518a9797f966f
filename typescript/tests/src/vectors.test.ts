/** The shared payload hash vectors (contracts/payload_hash_vectors.json), hashed here as in Python. */
import assert from "node:assert/strict";
import { join } from "node:path";
import { test } from "node:test";
import { canonicalJson, idempotencyKey, PayloadHashError, parsePayload, payloadHash } from "@delivery-ledger/client";
import { readJson, ROOT } from "./support.js";

type Vector = { name: string; json: string; canonical: string; canonical_hex: string; payload_hash: string };
type Refused = { name: string; json: string; field: string };
const vectors = readJson(join(ROOT, "contracts", "payload_hash_vectors.json")) as { vectors: Vector[]; refused: Refused[] };

test("every vector: the canonical bytes and the hash Python computes", () => {
  assert.ok(vectors.vectors.length >= 40);
  const names = new Set(vectors.vectors.map((v) => v.name));
  for (const wanted of ["float-one", "key-order-utf16-not-code-points", "astral-values", "negative-zero", "unicode"]) {
    assert.ok(names.has(wanted), wanted); // floats, unicode and key order are covered
  }
  for (const vector of vectors.vectors) {
    const payload = parsePayload(vector.json);
    assert.equal(canonicalJson(payload).toString("hex"), vector.canonical_hex, vector.name);
    assert.equal(canonicalJson(payload).toString("utf8"), vector.canonical, vector.name);
    assert.equal(payloadHash(payload), vector.payload_hash, vector.name);
  }
});

test("every refused payload is refused, naming its field", () => {
  assert.ok(vectors.refused.length >= 2);
  for (const refused of vectors.refused) {
    assert.throws(
      () => payloadHash(parsePayload(refused.json)),
      (error: unknown) => error instanceof PayloadHashError && error.field === refused.field && !error.message.includes("\n"),
      refused.name,
    );
  }
  assert.throws(() => payloadHash({ x: [1, Number.NaN] }), (e: unknown) => e instanceof PayloadHashError && e.field === "payload.x[1]");
});

test("the idempotency key is the Python side's: sha256 of run:event_type:channel:recipient", () => {
  // From events/keys.py idempotency_key(...), with the same arguments.
  assert.equal(
    idempotencyKey("run-1", "run.succeeded", "webhook", "https://example.test/hook"),
    "e5b2357a831ad0ec7d5d43385b7c14a1ee41fe071e339d91c72d272730121be4",
  );
  assert.equal(
    idempotencyKey("run/\u00e9-2", "report.ready", "webhook", "https://example.test/hook?a=1"),
    "e4c022756a2871c7d27e6ee94d4be2a1e76e228693a3e1539962b0708999264f",
  );
});
