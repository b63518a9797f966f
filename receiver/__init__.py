"""The receiver kit: the receiving half of the ledger's exactly-once protocol.

Verify Standard Webhooks signatures, record the idempotency key at receipt, run the
handler once per key, refuse stale fencing tokens, serve the lookup the ledger settles
UNKNOWN deliveries with. A key whose handler died mid-run (its handler lease ran out) is
run again if the handler is declared idempotent, else answered ``stuck`` for an operator
(``receiver.kit``, docs/LOOKUP_CONTRACT.md). Needs neither faust nor Kafka
(``delivery-ledger[receiver]``).
"""

from events.contract import FENCING_TOKEN_HEADER
from receiver.kit import ReceivedWebhook, Reply, WebhookReceiver
from receiver.records import KeyRecord, KeyStatus, LeaseTerms
from receiver.sqlite import SqliteStore
from receiver.store import IdempotencyStore, open_store
from receiver.verification import SignatureVerifier

__all__ = [
    "FENCING_TOKEN_HEADER",
    "IdempotencyStore",
    "KeyRecord",
    "KeyStatus",
    "LeaseTerms",
    "ReceivedWebhook",
    "Reply",
    "SignatureVerifier",
    "SqliteStore",
    "WebhookReceiver",
    "open_store",
]
