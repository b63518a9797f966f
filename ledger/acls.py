"""Kafka ACLs per role: what each principal of the ledger may do, and granting them.

agents write runs and requests; workers read ``ledger.runs`` (to fan out the deliveries
a run record carries) and read and write ``ledger.deliveries`` (requests fanned out, claims and
outcomes), ``ledger.budgets`` (spends) and ``ledger.endpoints`` (circuit transitions) and
write dead letters; the live projector reads and writes dead letters (for
``ledger.runs``, ``ledger.endpoints`` and ``ledger.budgets``, which it reads too);
operators (``ledger resolve``/``ledger redrive``) append their signed events to
``ledger.deliveries`` (they select from the projection), and set, clear, release and read
agents' budgets on ``ledger.budgets``, which workers read and append to;
dashboard, replay and verify only read. The HTTP ingest API (``ledger api``) is an agent
for every agent that holds one of its keys: it writes runs and requests under its own
transactional ids, and reads the API keys, which operators issue and revoke. Kafka ACLs
are per topic: requests and outcome events share ``ledger.deliveries``, so an agent
principal can still append an outcome event there (see the README, Security).
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import IntEnum
from typing import Literal

from aiokafka.admin import AIOKafkaAdminClient
from aiokafka.errors import KafkaConnectionError
from aiokafka.protocol.admin import CreateAclsRequest

from clients.aiokafka_internals import send_admin_request
from clients.kafka_security import client_options, connect_error
from config.settings import Settings
from events.errors import LedgerError

Role = Literal["agent", "worker", "projector", "operator", "reader", "api"]
ROLES: tuple[Role, ...] = ("agent", "worker", "projector", "operator", "reader", "api")
# The transactional ids agents use unless they give their own (clients/publisher.py).
AGENT_TRANSACTIONAL_PREFIX = "ledger-publisher-"
# The API server's (api/publishing.py), unless LEDGER_API__TRANSACTIONAL_ID names one.
API_TRANSACTIONAL_PREFIX = "ledger-api-"

# The roles whose ACLs the principal running each ``ledger`` command needs (the README's
# table, Security). Commands that talk to no broker are not listed; those in
# SUPER_USER_COMMANDS need a super user. A dashboard whose buttons act (an operator key
# is set) is an operator as well as a reader.
COMMAND_ROLES: dict[str, tuple[Role, ...]] = {
    "publish": ("agent",),
    "api": ("api",),
    "worker": ("worker",),
    "project": ("projector",),
    "dashboard": ("reader",),
    "status": ("reader",),
    "replay": ("reader",),
    "rebuild": ("reader",),
    "verify": ("reader",),
    "resolve": ("operator",),
    "redrive": ("operator",),
    "endpoints": ("operator",),
    "budgets": ("operator",),
    "api-keys": ("operator",),
}
SUPER_USER_COMMANDS = frozenset({"topics create", "acls grant"})


def command_roles(command: str, settings: Settings) -> tuple[Role, ...]:
    """The roles ``ledger COMMAND`` (a path: ``"endpoints list"``) needs under ``settings``."""
    roles = COMMAND_ROLES.get(command, COMMAND_ROLES.get(command.split(" ")[0], ()))
    if command == "dashboard" and settings.signing.operator_key is not None:
        return (*roles, "operator")
    return roles


class Resource(IntEnum):
    """Kafka's resource types (the wire values)."""

    TOPIC = 2
    GROUP = 3
    CLUSTER = 4
    TRANSACTIONAL_ID = 5


class Pattern(IntEnum):
    """How a resource name matches."""

    LITERAL = 3
    PREFIXED = 4


class Operation(IntEnum):
    """Kafka's ACL operations (the wire values)."""

    ALL = 2
    READ = 3
    WRITE = 4
    CREATE = 5
    DESCRIBE = 8
    DESCRIBE_CONFIGS = 10


ALLOW = 3


@dataclass(frozen=True)
class Acl:
    """One ALLOW rule: ``principal`` may do ``operation`` on a resource."""

    principal: str
    operation: Operation
    resource: Resource
    name: str
    pattern: Pattern = Pattern.LITERAL

    def describe(self) -> str:
        """One line, as ``kafka-acls --list`` would say it."""
        how = "prefix " if self.pattern is Pattern.PREFIXED else ""
        return f"{self.principal} {self.operation.name} {self.resource.name} {how}{self.name}"


def _on_topics(principal: str, operations: tuple[Operation, ...], *topics: str) -> list[Acl]:
    return [Acl(principal, op, Resource.TOPIC, t) for t in topics for op in operations]


def role_acls(
    settings: Settings,
    role: Role,
    principal: str,
    *,
    transactional_prefix: str = AGENT_TRANSACTIONAL_PREFIX,
) -> list[Acl]:
    """The ALLOW rules of one role for ``principal`` (``User:name``)."""
    runs, deliveries, deadletter = settings.kafka.topic_names()
    budgets = settings.kafka.topic_budgets
    endpoints = settings.kafka.topic_endpoints  # read by every role but the agent
    write, read = (Operation.WRITE, Operation.DESCRIBE), (Operation.READ, Operation.DESCRIBE)
    if role == "agent":
        return [
            *_on_topics(principal, write, runs, deliveries),
            *(
                Acl(
                    principal, op, Resource.TRANSACTIONAL_ID, transactional_prefix, Pattern.PREFIXED
                )
                for op in write
            ),
        ]
    if role == "api":
        return [
            *_on_topics(principal, write, runs, deliveries),
            *_on_topics(principal, read, settings.kafka.topic_api_keys),
            *(
                Acl(
                    principal,
                    op,
                    Resource.TRANSACTIONAL_ID,
                    settings.api.transactional_id or API_TRANSACTIONAL_PREFIX,
                    Pattern.LITERAL if settings.api.transactional_id else Pattern.PREFIXED,
                )
                for op in write
            ),
        ]
    if role == "worker":
        group = settings.worker.group
        return [
            # Budgets: every worker reads the whole topic and appends what it spends. The
            # registry: every worker reads it whole and appends its breaker's transitions
            # (streams/breaker_gate.py).
            *_on_topics(principal, (*read, Operation.WRITE), deliveries, budgets, endpoints),
            # Run records, whose deliveries it fans out (the publisher's record mode).
            *_on_topics(principal, read, runs),
            *_on_topics(principal, write, deadletter, settings.kafka.topic_heartbeats),
            # The consumer group and the continuity guard's ("<group>.continuity"), and
            # faust's own topics (changelogs: "<group>-...").
            *(
                Acl(principal, op, Resource.GROUP, group, Pattern.PREFIXED)
                for op in (Operation.READ, Operation.DESCRIBE)
            ),
            Acl(principal, Operation.ALL, Resource.TOPIC, f"{group}-", Pattern.PREFIXED),
        ]
    if role == "projector":
        # A reader that dead-letters the bad records of ledger.runs, the registry and the
        # budgets (projections/deadletters.py).
        return [
            *_on_topics(
                principal, read, runs, deliveries, deadletter, settings.kafka.topic_heartbeats
            ),
            *_on_topics(principal, (Operation.WRITE,), deadletter),
            *_on_topics(principal, read, endpoints, budgets),
        ]
    if role == "operator":
        # Resolve and redrive events, on the deliveries' own topic (per topic, as for the
        # agent: nothing finer). What the operator acts on is read from the projection.
        # And ``ledger endpoints``, ``ledger budgets`` and ``ledger api-keys``: each read,
        # then appended to.
        return [
            *_on_topics(principal, write, deliveries),
            *_on_topics(
                principal,
                (*read, Operation.WRITE),
                endpoints,
                budgets,
                settings.kafka.topic_api_keys,
            ),
        ]
    return _on_topics(
        principal,
        read,
        runs,
        deliveries,
        deadletter,
        settings.kafka.topic_heartbeats,
        endpoints,
        budgets,
    )


async def grant(settings: Settings, acls: list[Acl]) -> None:
    """Create the ALLOW rules (idempotent: an existing rule is not an error)."""
    admin = AIOKafkaAdminClient(
        bootstrap_servers=settings.kafka.bootstrap_servers,
        request_timeout_ms=15000,
        **client_options(settings.kafka),
    )
    try:
        await admin.start()
    except KafkaConnectionError:
        await admin.close()
        raise await connect_error(settings.kafka) from None
    try:
        for acl in acls:
            request = CreateAclsRequest(
                acl.resource, acl.name, acl.pattern, acl.principal, "*", acl.operation, ALLOW
            )
            response = await send_admin_request(admin, request)
            code, message = response.creation_responses[0][:2]
            if code != 0:
                raise LedgerError(
                    f"the broker refused the ACL '{acl.describe()}': error {code} "
                    f"{message or ''}".strip(),
                    "grant ACLs as a super user, on a broker with an authorizer",
                )
    finally:
        await admin.close()
