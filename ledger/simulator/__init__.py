"""``ledger fake-provider``: a webhook receiver + messaging-provider simulator with faults.

It speaks both channels (Standard Webhooks receiver, provider API), dedupes by idempotency
key, answers lookups, verifies signatures, records every request and every accepted
logical event, and injects faults on command (HTTP control API or Python).
"""

from ledger.simulator.faults import Fault, FaultKind, FaultMix
from ledger.simulator.receiver import SimulatorConfig
from ledger.simulator.records import AcceptedEvent, RequestRecord
from ledger.simulator.server import Simulator

__all__ = [
    "AcceptedEvent",
    "Fault",
    "FaultKind",
    "FaultMix",
    "RequestRecord",
    "Simulator",
    "SimulatorConfig",
]
