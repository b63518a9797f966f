/**
 * Against the real thing (pytest starts a broker, `ledger worker`, `ledger api` and the
 * projection, and gives their URLs): runs published with the client are delivered exactly
 * once to the TypeScript kit, and a delivery whose answer timed out after the kit recorded
 * it (UNKNOWN at the worker) is settled by the kit's lookup: CONFIRMED, never sent again.
 * Skipped without LEDGER_API_URL.
 */
import assert from "node:assert/strict";
import { writeFileSync } from "node:fs";
import { test } from "node:test";
import { type DeliveryAnswer, idempotencyKey, LedgerApiError, LedgerClient, payloadHash } from "@delivery-ledger/client";
import { CountingKit, testStore, waitFor } from "./support.js";

const api = process.env.LEDGER_API_URL;
const SLOW_MS = 3_500; // above the worker's send deadline in the test (1.5 s)

test("the client's runs reach the TypeScript kit exactly once; its lookup settles an UNKNOWN", { skip: !api }, async () => {
  const port = Number(process.env.LEDGER_TS_RECEIVER_PORT);
  const suffix = process.env.LEDGER_TS_RUN_SUFFIX ?? String(Date.now());
  const kit = new CountingKit(testStore(`receiver_keys_ts_e2e_${suffix}`), async (event) => {
    const payload = event.payload as { n: number; slow?: boolean };
    if (payload.slow) await new Promise((resolve) => setTimeout(resolve, SLOW_MS));
    return `ts-${payload.n}-${event.webhookId.slice(0, 12)}`;
  });
  await kit.start(port);
  try {
    const client = new LedgerClient({ baseUrl: api as string, apiKey: process.env.LEDGER_API_KEY as string });
    const recipient = (name: string) => `${kit.url}/hooks/${name}`;
    const runs = [`ts-run-a-${suffix}`, `ts-run-b-${suffix}`];
    const deliveries = [
      { channel: "webhook" as const, recipient: recipient("orders"), payload: { n: 1, amount: 1.0, "\u00e9": "x" }, event_type: "order.created" },
      { channel: "webhook" as const, recipient: recipient("tickets"), payload: { n: 2 } },
    ];
    const first = await client.completeRun(runs[0] as string, { result_hash: "sha256:ts-a", deliveries });
    assert.equal(first.replayed, false);
    // A retry of the same request: the first answer again, published once.
    const again = await client.completeRun(runs[0] as string, { result_hash: "sha256:ts-a", deliveries });
    assert.equal(again.replayed, true);
    assert.deepEqual(again.deliveries, first.deliveries);
    // The keys and hashes the API answered are the ones computed here.
    assert.deepEqual(
      first.deliveries.map((d) => [d.idempotency_key, d.payload_hash]),
      deliveries.map((d) => [
        idempotencyKey(runs[0] as string, d.event_type ?? "run.succeeded", d.channel, d.recipient),
        payloadHash(d.payload),
      ]),
    );
    // The failure-matrix row: the kit records it, its answer comes after the deadline.
    const slow = await client.completeRun(runs[1] as string, {
      result_hash: "sha256:ts-b",
      deliveries: [{ channel: "webhook", recipient: recipient("slow"), payload: { n: 3, slow: true } }],
    });
    // A different body for the same run is a 409 naming the field, in one line.
    await assert.rejects(
      client.completeRun(runs[1] as string, { result_hash: "sha256:other", deliveries: [] }),
      (error: unknown) =>
        error instanceof LedgerApiError &&
        error.status === 409 &&
        error.problem.field !== undefined &&
        !error.message.includes("\n") &&
        /409 run .* already published with a different/.test(error.message),
    );
    const keys = [...first.deliveries, ...slow.deliveries].map((d) => d.idempotency_key);
    const slowKey = slow.deliveries[0]?.idempotency_key as string;

    const confirmed = await waitFor(
      async () => {
        const answers: DeliveryAnswer[] = [];
        for (const run of runs) answers.push(...(await client.getRun(run)).deliveries);
        return answers.length === 3 && answers.every((d) => d.status === "CONFIRMED") && answers;
      },
      45_000,
      "all three deliveries CONFIRMED in GET /v1/runs",
    );
    for (const key of keys) {
      assert.equal(kit.runs.get(key), 1, `handler runs of ${key}`);
      assert.equal(kit.posts.get(key), 1, `POSTs of ${key} (no retry: the lookup settled it)`);
      const record = await kit.receiver.store.get(key);
      assert.equal(record?.status, "done");
      const delivery = confirmed.find((d) => d.idempotency_key === key);
      assert.equal(delivery?.provider_message_id, record?.resultId);
    }
    assert.ok((kit.lookups.get(slowKey) ?? 0) >= 1, "the worker looked the slow key up");
    const one = await client.getDelivery(slowKey);
    assert.equal(one.status, "CONFIRMED");
    assert.equal(one.attempts, 1);
    const run = await client.getRun(runs[1] as string);
    assert.equal(run.execution.status, "SUCCEEDED");
    if (process.env.LEDGER_TS_RESULTS) {
      writeFileSync(process.env.LEDGER_TS_RESULTS, JSON.stringify({ keys, slowKey, lookups: kit.lookups.get(slowKey) }));
    }
  } finally {
    await kit.stop();
  }
});
