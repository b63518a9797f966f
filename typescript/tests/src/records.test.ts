/** The admission rule, as receiver/records.py decides it (tests/receiver/ test the Python one). */
import assert from "node:assert/strict";
import { test } from "node:test";
import { admit, type KeyRecord, type LeaseTerms, lookupReply } from "@delivery-ledger/receiver";

const terms = (now: number, idempotentHandler = false): LeaseTerms => ({ holder: `h${now}`, now, leaseS: 30, idempotentHandler });
const record = (fields: Partial<KeyRecord>): KeyRecord => ({
  key: "k",
  status: "processing",
  fencingToken: null,
  resultId: null,
  error: null,
  leaseHolder: "h0",
  leaseExpiresAt: 30,
  ...fields,
});

test("new, done, failed, running and stale keys", () => {
  assert.equal(admit(null, "k", 1n, terms(0)).admission, "run");
  const done = record({ status: "done", resultId: "r", fencingToken: 2n });
  assert.equal(admit(done, "k", 3n, terms(1)).admission, "duplicate");
  assert.equal(admit(done, "k", 3n, terms(1)).record.fencingToken, 3n); // the newest token is kept
  assert.deepEqual(
    [admit(done, "k", 1n, terms(1)).admission, admit(done, "k", 1n, terms(1)).seenToken],
    ["stale", 2n],
  );
  assert.equal(admit(record({ status: "failed" }), "k", null, terms(1)).admission, "run");
  assert.equal(admit(record({}), "k", null, terms(1)).admission, "in_progress");
});

test("a dead run's key: run again if the handler is idempotent, else stuck", () => {
  const dead = record({ leaseExpiresAt: 30 });
  const again = admit(dead, "k", null, terms(31, true));
  assert.deepEqual([again.admission, again.reclaimed, again.record.leaseHolder], ["run", true, "h31"]);
  assert.equal(admit(dead, "k", null, terms(31)).admission, "stuck");
  assert.equal(admit(record({ leaseExpiresAt: null }), "k", null, terms(1)).admission, "stuck"); // no lease: an old kit's
  assert.deepEqual(lookupReply(dead, "k", 31, false), { status: 409, body: { status: "stuck", webhook_id: "k" } });
  assert.deepEqual(lookupReply(dead, "k", 31, true), { status: 404, body: { status: "failed", webhook_id: "k" } });
  assert.deepEqual(lookupReply(dead, "k", 1, false), { status: 202, body: { status: "processing", webhook_id: "k" } });
});
