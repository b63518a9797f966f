"""The parts ``Settings`` is made of, one per component that reads them.

Each part is a frozen pydantic model that refuses unknown fields, so a misspelled
``LEDGER_WORKER__LEASE_SECONDS`` is an error at start instead of a default silently kept.
A component is given its part (or the few it needs), never the whole ``Settings``:

* ``KafkaSettings``: where the brokers are, how clients authenticate, the topics; also the
  local broker that ``ledger broker start`` runs.
* ``PublisherSettings``: the agents' publisher (clients/publisher.py, group commit).
* ``ChannelSettings``: outbound sends, for every channel: HTTP, deadlines, retry
  policies, the address guard, the webhook endpoints, and each channel plugin's own entry.
* ``WorkerSettings``: the delivery worker (streams/): group, lease, timers, the broker
  clock, lookups, its metrics endpoint.
* ``SigningSettings``: signed outcome events (workers sign, every folding reader checks).
* ``DashboardSettings``: ``ledger dashboard``.
* ``ApiSettings``: ``ledger api``, the HTTP ingest API.
* ``ProjectionSettings``: the projections' database.

Every duration ends in ``_s`` and is seconds (a float unless an event field it feeds is
an integer: ``default_slo_s``). A field's docstring is its description in
docs/SETTINGS.md (``python -m config.table``).
"""

from __future__ import annotations

import base64
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Literal, Self

from pydantic import BaseModel, ConfigDict, Field, JsonValue, Secret, SecretStr, field_validator

from config.keys import SIGNING_KEY, VERIFY_KEY, key_bytes
from events.addresses import parse_network
from events.retry_policy import RetryPolicy, for_channel

# Inputs stay out of error texts: a setting may be a secret (a key, a token, a password).
PART = ConfigDict(
    frozen=True, extra="forbid", hide_input_in_errors=True, use_attribute_docstrings=True
)


def refuse_update(update: Mapping[str, Any] | None) -> None:
    """``model_copy(update=...)`` validates nothing, so a stale or misspelled name would
    silently change nothing: settings are derived with ``config.settings.changed``."""
    if update:
        raise TypeError(
            "settings are not copied with model_copy(update=...), which validates nothing: "
            "use config.settings.changed(settings, {'part.field': value})"
        )


class Part(BaseModel):
    """A part of ``Settings``: frozen, refuses unknown fields, copied only validated."""

    model_config = PART

    def model_copy(self, *, update: Mapping[str, Any] | None = None, deep: bool = False) -> Self:
        """A plain copy; with ``update``, TypeError (use ``config.settings.changed``)."""
        refuse_update(update)
        return super().model_copy(deep=deep)


class KafkaSettings(Part):
    """The brokers, how every Kafka client authenticates, and the topics."""

    bootstrap_servers: str = ""
    """Brokers to connect to, host:port[,host:port] (empty: broker_host:broker_port)."""
    security_protocol: Literal["PLAINTEXT", "SSL", "SASL_PLAINTEXT", "SASL_SSL"] = "PLAINTEXT"
    """How every Kafka client connects (clients/kafka_security.py); PLAINTEXT suits a
    local broker on loopback."""
    sasl_mechanism: Literal["PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512"] = "PLAIN"
    """SASL mechanism for SASL_SSL/SASL_PLAINTEXT."""
    sasl_username: str | None = None
    """SASL user (SASL_* protocols only)."""
    sasl_password: SecretStr | None = None
    """SASL password (SASL_* protocols only)."""
    ssl_cafile: Path | None = None
    """PEM file of the CA that signed the brokers' certificates (none: the system's CAs)."""
    ssl_certfile: Path | None = None
    """PEM client certificate, for brokers that authenticate clients by TLS."""
    ssl_keyfile: Path | None = None
    """PEM key of the client certificate."""
    ssl_key_password: SecretStr | None = None
    """Password of the client certificate's key."""
    topic_runs: str = "ledger.runs"
    """Topic of the execution events."""
    topic_deliveries: str = "ledger.deliveries"
    """Topic of the delivery events."""
    topic_deadletter: str = "ledger.deadletter"
    """Topic of undecodable or invalid records."""
    topic_heartbeats: str = "ledger.heartbeats"
    """Workers' heartbeats: compacted, timestamped by the broker (streams/heartbeat.py)."""
    topic_endpoints: str = "ledger.endpoints"
    """The endpoint registry: compacted, one partition, keyed by endpoint id
    (events/endpoints.py; ``ledger endpoints``)."""
    topic_budgets: str = "ledger.budgets"
    """Per-agent send budgets, keyed by agent: set, cleared, released and spent
    (events/budgets.py)."""
    topic_api_keys: str = "ledger.api_keys"
    """API keys of the HTTP ingest API: compacted, one partition, keyed by key id
    (events/api_keys.py; ``ledger api-keys``)."""
    partitions: int = Field(default=8, ge=1, le=1024)
    """Partitions of the topics the ledger creates."""
    replication_factor: int = Field(default=0, ge=0, le=32)
    """Copies of each partition of the topics the ledger (and the worker's changelog)
    creates (0: decided from the live cluster, 3 where it has three or more brokers, else
    1; ledger/topics.py)."""
    min_insync_replicas: int = Field(default=0, ge=0, le=32)
    """``min.insync.replicas`` of those topics: with ``acks=all`` a write is taken once
    this many copies have it (0: 2 where the replication factor is 3 or more, else the
    broker's default)."""
    broker_host: str = "127.0.0.1"
    """The local broker (``ledger broker start``): its host."""
    broker_port: int = Field(default=9092, ge=1, le=65535)
    """The local broker's client port."""
    controller_port: int = Field(default=9093, ge=1, le=65535)
    """The local broker's controller port."""
    broker_sasl_ssl_port: int = Field(default=0, ge=0, le=65535)
    """An extra SASL_SSL listener of the local broker, with a generated CA, SASL users and
    the ACL authorizer (0: none)."""
    version: str = "4.1.1"
    """Kafka version of the local broker."""

    def topic_names(self) -> tuple[str, str, str]:
        """The three topics the ledger owns, in creation order."""
        return (self.topic_runs, self.topic_deliveries, self.topic_deadletter)


class PublisherSettings(Part):
    """The agents' publisher (clients/publisher.py) and its group commit."""

    producer_name: str = "ledger-cli"
    """The ``producer`` every published event carries."""
    mode: Literal["transaction", "record"] = "transaction"
    """How a run's result and its deliveries are written atomically (clients/publisher.py):
    ``transaction``, ``RunSucceeded`` and one ``DeliveryRequested`` per delivery in one
    Kafka transaction (group commit across a publisher's concurrent callers); ``record``,
    one ``RunSucceeded`` record carrying its deliveries, written by an idempotent producer
    without a transaction, that the workers fan out (events/fan_out.py): cheaper for
    publishers that each publish one run at a time."""
    max_payload_bytes: int = Field(default=256 * 1024, ge=1)
    """Largest delivery payload accepted."""
    default_slo_s: int = Field(default=300, ge=1)
    """A delivery's SLO when the request names none (whole seconds: the event's field)."""
    transaction_timeout_s: float = Field(default=15.0, ge=1.0)
    """Kafka transaction timeout of the publisher's producer."""
    max_runs_per_transaction: int = Field(default=256, ge=1)
    """Group commit (clients/group_commit.py): concurrent runs of one publisher share one
    Kafka transaction of at most this many runs."""
    max_transaction_bytes: int = Field(default=1024 * 1024, ge=1)
    """Group commit: at most this many bytes in one transaction."""
    linger_s: float = Field(default=0.001, ge=0, le=1.0)
    """How long the first run of a transaction waits for company (0: none), counted from
    the previous commit too: 1 ms also spares most transactions the broker's
    CONCURRENT_TRANSACTIONS answer right after a commit (bench/publisher.py)."""


class RateLimitSpec(BaseModel):
    """A rate limit: deliveries per second to one endpoint, over all workers together."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    per_s: float = Field(gt=0)
    # Tokens a quiet endpoint may save up, over all workers, each worker at least one
    # (None: per_s x 0.05 s, what the gate's 50 ms looks need); streams/rate_gate.py.
    burst: float | None = Field(default=None, ge=1)


class WebhookEndpoint(BaseModel):
    """One webhook endpoint: its secrets, its lookup, and what its receiver promises."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    # Standard Webhooks secrets ("whsec_" + base64). During a rotation several are active
    # and every one of them signs: the receiver accepts whichever it already knows.
    # ``secret`` is one more, kept for configurations written before rotation existed.
    secret: SecretStr | None = None
    secrets: list[SecretStr] = Field(default_factory=list)
    lookup_url: str | None = None
    # Declared by the endpoint's owner, never assumed: the receiver dedupes on webhook-id,
    # so a retry after UNKNOWN is safe without a lookup (the declaration goes into the
    # retry's event). Without it and without a lookup, an UNKNOWN stays for an operator.
    receiver_dedupes: bool = False
    # How long after an UNKNOWN its receiver may still be processing the request: no
    # lookup before it (None: worker.lookup_settle_s).
    settle_s: float | None = Field(default=None, ge=0)
    # Networks (CIDR or addresses) this endpoint's host may resolve to beyond the globally
    # routable ones, for it alone (and its lookup URL): an internal receiver allowed
    # without opening that network to every recipient.
    allowed_networks: list[str] = Field(default_factory=list)
    # At most this many deliveries per second to this endpoint, all workers together
    # (streams/rate_gate.py); None: no limit. The burst in tokens (None: the gate's default).
    rate_limit_per_s: float | None = Field(default=None, gt=0)
    rate_limit_burst: float | None = Field(default=None, ge=1)

    @field_validator("allowed_networks")
    @classmethod
    def _endpoint_networks_parse(cls, value: list[str]) -> list[str]:
        for network in value:
            parse_network(network)  # ValueError names the bad entry
        return value

    def signing_secrets(self) -> list[SecretStr]:
        """Every active secret of this endpoint (``secret`` first), each once."""
        found = [self.secret, *self.secrets] if self.secret is not None else list(self.secrets)
        unique: dict[str, SecretStr] = {}
        for secret in found:
            unique.setdefault(secret.get_secret_value(), secret)
        return list(unique.values())


class ChannelSettings(Part):
    """Outbound sends, every channel: HTTP, deadlines, retries, addresses, and each
    channel's own configuration."""

    settings: dict[str, Secret[dict[str, JsonValue]]] = Field(default_factory=dict)
    """Per channel plugin, its configuration (tokens, hosts, secrets) as JSON, by channel
    name: ``{"slack": {"tokens": {"acme": "xoxb-..."}}}``. Each entry is hidden whole and
    validated by its plugin (``ledger channels`` lists what each takes)."""
    webhook_secret: SecretStr | None = None
    """Standard Webhooks signing secret ("whsec_" + base64) for recipients whose endpoint
    has none of its own. A worker refuses to start unless this is set or every endpoint
    has its own (then a recipient outside them is refused)."""
    webhook_endpoints: dict[str, WebhookEndpoint] = Field(default_factory=dict)
    """Per webhook endpoint, by recipient URL prefix (scheme, host and port exactly, path
    on a segment boundary; the longest wins), as JSON: ``{"https://host/hooks/":
    {"secrets": ["whsec_..."], "lookup_url": "https://host/lookup"}}``."""
    retry_policies: dict[str, RetryPolicy] = Field(default_factory=dict)
    """Per channel, replacing fields of its default retry policy, as JSON:
    ``{"webhook": {"base_delay_s": 5, "max_attempts": 4}}``."""
    allowed_networks: list[str] = Field(default_factory=list)
    """Networks (CIDR or addresses, JSON list) a delivery may make us contact beyond the
    globally routable ones (loopback, private, link-local are refused by default)."""
    allowed_hosts: list[str] = Field(default_factory=list)
    """Host names (JSON list) a delivery may make us contact whatever they resolve to."""
    http_connect_timeout_s: float = Field(default=2.0, gt=0)
    """Outbound HTTP connect timeout."""
    http_timeout_s: float = Field(default=5.0, gt=0)
    """Outbound HTTP timeout per phase; must not exceed the shortest send deadline."""
    send_concurrency: int = Field(default=64, ge=1)
    """Concurrent sends of one worker (the size of the shared connection pool)."""
    http_pool: Literal["aiohttp", "httpcore"] = "aiohttp"
    """The connection pool under httpx (streams/channels/http.py): aiohttp's, or
    httpcore's; both guard addresses and writes the same way."""
    send_deadline_s: float = Field(default=10.0, gt=0)
    """Every send and lookup ends within this, all phases together (pool wait, connect,
    write, wait, body): the hard total deadline."""
    send_deadlines: dict[str, float] = Field(default_factory=dict)
    """Per channel, replacing send_deadline_s, as JSON: ``{"browser": 20}``."""
    rate_limits: dict[str, RateLimitSpec] = Field(default_factory=dict)
    """Deliveries per second, all workers together, by ``channel:recipient-prefix`` (or a
    bare ``channel`` for all of it; the longest matching key wins), as JSON: ``{"slack:acme/C123":
    1, "email": {"per_s": 50, "burst": 10}}``. A webhook endpoint's own
    ``rate_limit_per_s`` comes first (matched on the parsed URL, streams/rate_limits.py)."""
    rate_limit_pacing: bool = True
    """Pace each worker's sends to a rate-limited endpoint at its share too, right before
    the request (streams/send_pacer.py), so arrivals keep the limit, not only claims;
    false: the claim's gate alone (arrivals may bunch by the claim -> send trip's jitter)."""

    @field_validator("allowed_networks")
    @classmethod
    def _networks_parse(cls, value: list[str]) -> list[str]:
        for network in value:
            parse_network(network)  # ValueError names the bad entry
        return value

    @field_validator("rate_limits", mode="before")
    @classmethod
    def _rate_limits_from_numbers(cls, value: object) -> object:
        # A bare number is the rate: {"slack:acme/C123": 1}.
        if not isinstance(value, dict):
            return value
        return {
            key: {"per_s": given}
            if isinstance(given, int | float) and not isinstance(given, bool)
            else given
            for key, given in value.items()
        }

    @field_validator("rate_limits")
    @classmethod
    def _rate_limit_keys_name_a_channel(
        cls, value: dict[str, RateLimitSpec]
    ) -> dict[str, RateLimitSpec]:
        for key in value:
            if not key.partition(":")[0]:
                raise ValueError("a rate_limits key is 'channel' or 'channel:recipient-prefix'")
        return value

    @field_validator("retry_policies", mode="before")
    @classmethod
    def _policies_from_channel_defaults(cls, value: object) -> object:
        # A field not given keeps the channel's default, not the generic one.
        if not isinstance(value, dict):
            return value
        return {
            channel: for_channel(channel, given) if isinstance(given, dict) else given
            for channel, given in value.items()
        }

    def deadline_for(self, channel: str) -> float:
        """The hard total deadline of one send or lookup of ``channel``."""
        return self.send_deadlines.get(channel, self.send_deadline_s)

    @property
    def longest_send_deadline_s(self) -> float:
        """The longest deadline of any channel: what budgets by the deadline plans for."""
        return max([self.send_deadline_s, *self.send_deadlines.values()])


class WorkerSettings(Part):
    """The delivery worker (streams/): consumer group, lease, timers, lookups."""

    group: str = "ledger-worker"
    """The workers' consumer group."""
    lease_s: float = Field(default=30.0, gt=0)
    """How long a claim lasts; must exceed the longest send deadline + clock_skew_margin_s."""
    claim_grace_s: float = Field(default=10.0, gt=0)
    """How long a proposed claim may stay unread before it is proposed again."""
    timer_interval_s: float = Field(default=0.5, gt=0)
    """How often the worker's timers (leases, retries, lookups) run."""
    linger_s: float = Field(default=0.02, ge=0, le=1.0)
    """How long the worker's producers (claims, changelog, outcomes) wait for company
    before sending a batch: a cheaper broker under load for a few ms per record (0: at
    once)."""
    fetch_wait_s: float = Field(default=0.0, ge=0, le=1.0)
    """How long the broker may hold the worker's fetch for company (up to 64 KiB) before
    answering it (0: as soon as one record is there)."""
    standby_replicas: int = Field(default=0, ge=0, le=8)
    """Standby copies of the worker's table kept warm by other workers: faster takeover
    for CPU on every delivery (0: a new owner rebuilds from the changelog)."""
    metrics_host: str = "127.0.0.1"
    """The worker's Prometheus endpoint: its address."""
    metrics_port: int = Field(default=0, ge=0, le=65535)
    """The worker's Prometheus endpoint: its port (0: off; one per worker on a host)."""
    clock_skew_margin_s: float = Field(default=2.0, ge=0)
    """How much the clocks of two workers may disagree; the lease rule allows for it."""
    clock_skew_limit_s: float = Field(default=30.0, gt=0)
    """Past this far off the broker's clock, a worker claims, sends and times nothing
    until its clock is back (streams/broker_clock.py)."""
    clock_probe_interval_s: float = Field(default=1.0, gt=0, le=60)
    """How often a worker measures the broker's clock with a heartbeat."""
    clock_stale_s: float = Field(default=15.0, gt=0)
    """A broker clock unmeasured for this long counts as off."""
    lookup_settle_s: float = Field(default=15.0, ge=0)
    """After an UNKNOWN, how long the first lookup waits (the receiver may still be
    processing the request the client gave up on)."""
    lookup_confirm_spacing_s: float = Field(default=5.0, ge=0)
    """A retry needs a second "not found", this long after the first."""
    lookup_backoff_s: float = Field(default=1.0, gt=0)
    """First wait between failing lookups."""
    lookup_backoff_max_s: float = Field(default=60.0, gt=0)
    """Longest wait between failing lookups."""
    max_lookups: int = Field(default=12, ge=2)
    """Lookups of one UNKNOWN attempt before it is left to an operator (stays UNKNOWN)."""
    max_open_claims: int = Field(default=0, ge=0)
    """Claims a worker keeps open at once (0: learnt from its sends, streams/claim_budget.py)."""
    static_membership: bool = True
    """Join the consumer group as a static member named after the worker and its host
    (``--name``@hostname): a worker restarted under the same name on the same host (a crash
    and its supervisor, a rolling restart) takes its own partitions back without a
    rebalance of the whole group; one stopped for good hands them over after the session
    timeout (10 s). Names must then be unique per host (their data dirs already are)."""
    max_sent_polls: int = Field(default=20, ge=1)
    """Lookups of a SENT delivery before it becomes UNKNOWN ("polling gave up")."""


class SigningSettings(Part):
    """Signed outcome events (clients/outcome_signing.py)."""

    outcomes: bool = True
    """Workers sign what they write and every folding reader refuses an unsigned outcome.
    Off (false) only on purpose: then anyone who may write ledger.deliveries can forge an
    outcome, and every worker and projector says so at start."""
    signing_key: SecretStr | None = None
    """The workers' Ed25519 signing key, base64 of 32 bytes (workers only; default: from
    DATA_DIR/keys, which ``ledger init`` writes)."""
    verify_keys: list[str] = Field(default_factory=list)
    """Public keys (JSON list, several during a rotation) every folding reader checks
    worker-written events against (default: from DATA_DIR/keys)."""

    operator_key: SecretStr | None = None
    """The operators' Ed25519 signing key, base64 (where operators act: ``ledger resolve``,
    ``ledger redrive``, the dashboard; default: from DATA_DIR/keys)."""
    operator_verify_keys: list[str] = Field(default_factory=list)
    """Public keys (JSON list) every folding reader checks operator events against
    (default: from DATA_DIR/keys)."""

    @field_validator("signing_key", "operator_key")
    @classmethod
    def _signing_key_parses(cls, value: SecretStr | None) -> SecretStr | None:
        if value is not None:
            key_bytes(value.get_secret_value(), SIGNING_KEY)  # ValueError: what, never the key
        return value

    @field_validator("verify_keys", "operator_verify_keys")
    @classmethod
    def _verify_keys_parse(cls, value: list[str]) -> list[str]:
        for key in value:
            key_bytes(key, VERIFY_KEY)
        return value


class DashboardSettings(Part):
    """``ledger dashboard``: where it listens, who may read it, what turns red."""

    host: str = "127.0.0.1"
    """Address the dashboard listens on."""
    port: int = Field(default=8765, ge=0, le=65535)
    """Port the dashboard listens on."""
    token: SecretStr | None = None
    """Bearer token required when bound to anything but loopback."""
    allowed_hosts: list[str] = Field(default_factory=list)
    """Host names (JSON list) it answers to besides its bound address (and, on loopback,
    localhost/127.0.0.1/::1): any other Host header gets 421."""
    refresh_s: float = Field(default=5.0, gt=0)
    """How often the page refreshes."""
    thresholds: dict[str, int] = Field(default_factory=dict)
    """Counter name -> value at which it turns red, as JSON."""


class ApiSettings(Part):
    """``ledger api``: the HTTP ingest API (api/): where it listens, its own database of
    first answers (idempotency), and its limits."""

    host: str = "127.0.0.1"
    """Address the API listens on."""
    port: int = Field(default=8780, ge=0, le=65535)
    """Port the API listens on (0: any free)."""
    dsn: str | None = None
    """The API's own database of first answers (idempotency by run id), by its scheme:
    ``sqlite:///path`` (none: ``api.sqlite3`` in the data dir), for API instances on one
    machine, or ``postgresql://user:password@host/db``, for instances on several machines.
    Every API instance that serves the same agents must share one. ``ledger api --dsn``
    overrides it."""
    transactional_id: str | None = None
    """Kafka transactional id of the API's publisher (none: ``ledger-api-`` and a random
    suffix). Give each instance a stable one to fence its dead predecessor at restart."""
    max_body_bytes: int = Field(default=1024 * 1024, ge=1024, le=64 * 1024 * 1024)
    """Largest request body accepted (413 above)."""
    max_deliveries_per_run: int = Field(default=100, ge=1, le=10_000)
    """Most deliveries one run may ask for (413 above)."""
    rate_per_key_s: float = Field(default=200.0, gt=0)
    """Requests per second each API key may make, per API process (a token bucket;
    429 with Retry-After beyond it)."""
    burst_per_key: int = Field(default=400, ge=1)
    """How many requests a key may make at once before the rate applies."""
    in_flight_stale_s: float = Field(default=60.0, gt=0)
    """A request still "in flight" after this long is taken to have died with its process:
    the next request for the same run takes it over (longer than a publish can take)."""

    @field_validator("dsn")
    @classmethod
    def _known_scheme(cls, value: str | None) -> str | None:
        if value is not None and not value.startswith(
            ("sqlite://", "postgresql://", "postgres://")
        ):
            raise ValueError("must be sqlite:///path or postgresql://user:password@host/db")
        return value


class EndpointSettings(Part):
    """The endpoint registry (``ledger.endpoints``): how its secrets are encrypted, how
    quickly its holds are looked at again."""

    encryption_keys: list[SecretStr] = Field(default_factory=list)
    """Fernet keys (JSON list of url-safe base64 of 32 bytes) the registry's signing
    secrets are encrypted with: the first encrypts, every one decrypts (put a new key
    first to rotate, then ``ledger endpoints reencrypt``). Make one with ``python -c 'import
    base64,os; print(base64.urlsafe_b64encode(os.urandom(32)).decode())'``."""
    recheck_s: float = Field(default=1.0, gt=0, le=60)
    """How often a delivery held by a paused or disabled endpoint is looked at again."""
    rotation_overlap_s: float = Field(default=24 * 3600.0, ge=0)
    """How long an endpoint's old secret keeps signing after ``rotate-secret``."""
    operator: str | None = None
    """Who acts in ``ledger endpoints`` (``--as`` overrides; default: the login name)."""

    @field_validator("encryption_keys")
    @classmethod
    def _keys_parse(cls, value: list[SecretStr]) -> list[SecretStr]:
        for number, key in enumerate(value, 1):
            try:
                raw = base64.urlsafe_b64decode(key.get_secret_value().encode("ascii"))
            except (ValueError, UnicodeEncodeError):
                raw = b""
            if len(raw) != 32:
                # Which one, never the key itself.
                raise ValueError(
                    f"encryption key number {number} is not url-safe base64 of 32 bytes"
                )
        return value


class BreakerSettings(Part):
    """The circuit breaker of each registered endpoint (streams/breaker_rule.py): when it
    opens, how long it stays open before one probe, when a long outage disables it."""

    enabled: bool = True
    """Off: this worker neither opens circuits nor holds deliveries for one."""
    window_s: float = Field(default=60.0, gt=0, le=3600)
    """The sliding window each worker counts its own sends to an endpoint over."""
    min_sends: int = Field(default=10, ge=1, le=1_000_000)
    """Fewer sends than this in the window never open the circuit."""
    failure_ratio: float = Field(default=0.5, gt=0, le=1)
    """Open when failures / sends in the window reach this."""
    open_s: float = Field(default=30.0, gt=0, le=86_400)
    """How long the circuit stays open before one probe delivery is let through; also how
    long a half-open probe may take before another worker names a new one."""
    auto_disable_s: float = Field(default=3 * 86_400.0, gt=0)
    """An outage (open and half-open, the probes failing) this long disables the endpoint
    (an ERROR line and ``ledger_worker_endpoint_auto_disabled``); an operator enables it."""


class ProjectionSettings(Part):
    """The projections (projections/): where the ledger tables live."""

    dsn: str | None = None
    """Projection database: ``postgresql://...`` or ``sqlite:///path`` (none: a SQLite
    file in the data dir). ``--dsn`` overrides it."""
