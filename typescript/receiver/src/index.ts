/**
 * @delivery-ledger/receiver: the receiving half of delivery-ledger's exactly-once protocol
 * for Node, with the Python kit's behaviour (receiver/ in the repository): Standard Webhooks
 * verification (the official `standardwebhooks` package), the key recorded at receipt,
 * the handler run once per key, stale fencing tokens refused, the signed lookup endpoint
 * the ledger settles UNKNOWN deliveries with. Stores: PostgreSQL (`pg`), or memory for
 * tests and development.
 */
export {
  FENCING_TOKEN_HEADER,
  FENCING_TOKEN_SIGNATURE_HEADER,
  fencingTokenSignature,
  LOOKUP_HTTP_STATUS,
  LOOKUP_SIGNATURE_HEADER,
  LOOKUP_TIMESTAMP_HEADER,
  type LookupAnswer,
  type LookupStatus,
  lookupHeaders,
  parseFencingToken,
  secretKey,
} from "./contract.js";
export {
  HANDLER_LEASE_S,
  type Handler,
  lookupReply,
  MAX_BODY_BYTES,
  type ReceivedWebhook,
  type ReceiverOptions,
  type Reply,
  WebhookReceiver,
} from "./kit.js";
export { MemoryStore } from "./memory.js";
export { PostgresStore, type PostgresStoreOptions } from "./postgres.js";
export { admit, type Decision, type KeyRecord, type KeyStatus, type LeaseTerms, leaseExpired } from "./records.js";
export { createReceiverServer, handleRequest, type ServerOptions } from "./server.js";
export { type IdempotencyStore, StoreUnavailable } from "./store.js";
export { SignatureVerifier } from "./verification.js";
