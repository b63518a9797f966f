/**
 * The kit's refusals over HTTP, on the store pytest gives (PostgreSQL) or memory: a bad
 * signature, a stale fencing token, an unsigned token, an unsigned lookup; a duplicate is
 * answered without running the handler again.
 */
import assert from "node:assert/strict";
import { randomUUID } from "node:crypto";
import http from "node:http";
import { after, before, test } from "node:test";
import { lookupHeaders, secretKey } from "@delivery-ledger/receiver";
import { CountingKit, SECRET, signedHeaders, testStore } from "./support.js";

const table = `receiver_keys_ts_${randomUUID().replaceAll("-", "").slice(0, 10)}`;
const kit = new CountingKit(testStore(table), (event) => `order-${event.webhookId.slice(0, 8)}`);

before(() => kit.start());
after(() => kit.stop());

async function post(id: string, body: string, headers: Record<string, string>) {
  const answer = await fetch(`${kit.url}/hooks/orders`, { method: "POST", body, headers });
  return { status: answer.status, body: (await answer.json()) as Record<string, unknown> };
}

async function lookup(key: string, headers: Record<string, string> = {}) {
  const answer = await fetch(`${kit.url}/hooks/lookup/${key}`, { headers });
  return { status: answer.status, body: (await answer.json()) as Record<string, unknown> };
}

const signedLookup = (key: string) => lookupHeaders([secretKey(SECRET)], key, Math.floor(Date.now() / 1000));

test("a bad signature is refused 401 and nothing is recorded", async () => {
  const id = `bad-${randomUUID()}`;
  const body = '{"n": 1}';
  const other = "whsec_" + Buffer.alloc(32, 9).toString("base64");
  const refused = await post(id, body, signedHeaders(id, body, { secret: other }));
  assert.equal(refused.status, 401);
  assert.equal(refused.body.error, "invalid webhook signature");
  assert.equal(refused.body.detail, "no v1 signature matches any of the receiver's secrets");
  // A body changed after signing: refused too.
  const tampered = await post(id, '{"n": 2}', signedHeaders(id, body));
  assert.equal(tampered.status, 401);
  assert.equal(kit.runs.get(id), undefined);
  assert.deepEqual(await lookup(id, signedLookup(id)), { status: 404, body: { status: "not_found", webhook_id: id } });
});

test("a stale fencing token is refused 409; an unsigned token 401; the newest runs once", async () => {
  const id = `fenced-${randomUUID()}`;
  const body = '{"n": 3}';
  const first = await post(id, body, signedHeaders(id, body, { token: 5n }));
  assert.deepEqual(first, { status: 200, body: { id: `order-${id.slice(0, 8)}`, webhook_id: id, duplicate: false } });
  const stale = await post(id, body, signedHeaders(id, body, { token: 3n }));
  assert.equal(stale.status, 409);
  assert.equal(stale.body.error, "stale fencing token");
  assert.match(String(stale.body.detail), /fencing token 3 is older than 5/);
  const unsigned = signedHeaders(id, body, { token: 9n });
  unsigned["fencing-token-signature"] = "v1,AAAA";
  assert.equal((await post(id, body, unsigned)).status, 401);
  const again = await post(id, body, signedHeaders(id, body, { token: 6n }));
  assert.deepEqual(again.body, { id: `order-${id.slice(0, 8)}`, webhook_id: id, duplicate: true });
  assert.equal(kit.runs.get(id), 1);
  assert.equal(kit.posts.get(id), 4);
});

test("the lookup answers only a signed, fresh request", async () => {
  const id = `looked-${randomUUID()}`;
  const body = "{}";
  await post(id, body, signedHeaders(id, body));
  assert.equal((await lookup(id)).status, 401);
  const old = lookupHeaders([secretKey(SECRET)], id, Math.floor(Date.now() / 1000) - 3600);
  assert.equal((await lookup(id, old)).status, 401);
  assert.deepEqual(await lookup(id, signedLookup(id)), {
    status: 200,
    body: { status: "done", webhook_id: id, id: `order-${id.slice(0, 8)}` },
  });
});

test("a body declared over 1 MiB is refused 413 before it is read", async () => {
  const url = new URL(`${kit.url}/hooks/orders`);
  const status = await new Promise<number>((resolve, reject) => {
    const request = http.request(
      { host: url.hostname, port: url.port, path: url.pathname, method: "POST", headers: { "content-length": String(2 * 1024 * 1024) } },
      (response) => {
        response.resume();
        resolve(response.statusCode ?? 0);
        request.destroy();
      },
    );
    request.on("error", reject);
    request.flushHeaders(); // the head only: the answer comes before any of the body
  });
  assert.equal(status, 413);
});
