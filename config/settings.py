"""One settings object for every part of delivery-ledger (env prefix ``LEDGER_``)."""

from __future__ import annotations

from pathlib import Path
from typing import Literal
from urllib.parse import urlsplit

from platformdirs import user_cache_dir, user_data_dir
from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    JsonValue,
    Secret,
    SecretStr,
    field_validator,
    model_validator,
)
from pydantic_settings import BaseSettings, SettingsConfigDict

from config.keys import SIGNING_KEY, VERIFY_KEY, key_bytes
from events.addresses import AddressPolicy, Origin, origin_of, parse_network
from events.channels.urls import SLACK_WORKSPACE
from events.retry_policy import RetryPolicy, for_channel


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
    # lookup before it (None: settings.lookup_settle_s).
    settle_s: float | None = Field(default=None, ge=0)
    # Networks (CIDR or addresses) this endpoint's host may resolve to beyond the globally
    # routable ones, for it alone (and its lookup URL): an internal receiver allowed
    # without opening that network to every recipient.
    allowed_networks: list[str] = Field(default_factory=list)

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

    def env_value(self) -> dict[str, object]:
        """This endpoint as the JSON a child process reads from LEDGER_WEBHOOK_ENDPOINTS
        (secrets revealed: ``model_dump`` would write asterisks)."""
        value = self.model_dump(mode="json", exclude={"secret", "secrets"}, exclude_none=True)
        if self.secret is not None:
            value["secret"] = self.secret.get_secret_value()
        if self.secrets:
            value["secrets"] = [secret.get_secret_value() for secret in self.secrets]
        return value


class Settings(BaseSettings):
    """Where the broker is, what the topics are called, and the limits we enforce."""

    # Inputs stay out of error texts: a setting may be a secret (a key, a token, a password).
    model_config = SettingsConfigDict(
        env_prefix="LEDGER_", frozen=True, extra="ignore", hide_input_in_errors=True
    )

    broker_host: str = "127.0.0.1"
    broker_port: int = Field(default=9092, ge=1, le=65535)
    controller_port: int = Field(default=9093, ge=1, le=65535)
    bootstrap_servers: str = ""
    kafka_version: str = "4.1.1"

    # How every Kafka client authenticates (clients/kafka_security.py turns these into
    # client options, once). PLAINTEXT by default: a local broker on loopback.
    security_protocol: Literal["PLAINTEXT", "SSL", "SASL_PLAINTEXT", "SASL_SSL"] = "PLAINTEXT"
    sasl_mechanism: Literal["PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512"] = "PLAIN"
    sasl_username: str | None = None
    sasl_password: SecretStr | None = None
    # PEM files: the CA that signed the brokers' certificates (None: the system's CAs),
    # and a client certificate with its key for brokers that authenticate clients by TLS.
    ssl_cafile: Path | None = None
    ssl_certfile: Path | None = None
    ssl_keyfile: Path | None = None
    ssl_key_password: SecretStr | None = None
    # The local broker (ledger broker start): an extra SASL_SSL listener on this port,
    # with a generated CA, SASL users and the ACL authorizer (0: none, as before).
    broker_sasl_ssl_port: int = Field(default=0, ge=0, le=65535)

    topic_runs: str = "ledger.runs"
    topic_deliveries: str = "ledger.deliveries"
    topic_deadletter: str = "ledger.deadletter"
    # Workers' heartbeats: compacted, timestamped by the broker (streams/heartbeat.py).
    topic_heartbeats: str = "ledger.heartbeats"
    partitions: int = Field(default=8, ge=1, le=1024)

    data_dir: Path = Path(user_data_dir("delivery-ledger"))
    cache_dir: Path = Path(user_cache_dir("delivery-ledger"))

    producer_name: str = "ledger-cli"
    max_payload_bytes: int = Field(default=256 * 1024, ge=1)
    default_slo_seconds: int = Field(default=300, ge=1)
    publisher_transaction_timeout_ms: int = Field(default=15000, ge=1000)
    # Group commit (clients/group_commit.py): concurrent runs of one publisher share one
    # Kafka transaction of at most this many runs and bytes; the first run of a
    # transaction waits at most ``publisher_linger_ms`` for company (0: none), counted
    # from the previous commit too: 1 ms also spares most transactions the broker's
    # CONCURRENT_TRANSACTIONS answer right after a commit (bench/publisher.py measures it).
    publisher_max_runs_per_transaction: int = Field(default=256, ge=1)
    publisher_max_transaction_bytes: int = Field(default=1024 * 1024, ge=1)
    publisher_linger_ms: float = Field(default=1.0, ge=0, le=1000)

    # Standard Webhooks signing secret ("whsec_" + base64) for recipients whose endpoint
    # has none of its own. No default: a worker refuses to start unless this is set or
    # every endpoint below has its own (then a recipient outside them is refused).
    webhook_secret: SecretStr | None = None
    # Per-endpoint configuration, by recipient URL prefix, as JSON. Matched on the parsed
    # URL: scheme, host and port exactly, path on a segment boundary; the longest wins:
    # {"https://host/hooks/": {"secrets": ["whsec_..."], "lookup_url": "https://host/lookup"}}
    webhook_endpoints: dict[str, WebhookEndpoint] = Field(default_factory=dict)
    # Per channel plugin, its configuration (tokens, hosts, secrets) as JSON, by channel
    # name: {"slack": {"bot_token": "xoxb-..."}}. Each entry is kept hidden whole (shown
    # as asterisks, never logged); the channel's plugin validates it into its own
    # settings model, with SecretStr fields for its secrets (config.channels.channel_config).
    channel_settings: dict[str, Secret[dict[str, JsonValue]]] = Field(default_factory=dict)

    # Slack (streams/channels/slack.py): one bot token (xoxb-...) per workspace, by the
    # workspace name a recipient uses (``WORKSPACE/CHANNEL_ID``), as JSON:
    # {"acme": "xoxb-..."}. The Web API's base URL (tests point it at the fake Slack), and
    # how many pages of conversations.history (200 messages each) one lookup may read.
    slack_tokens: dict[str, SecretStr] = Field(default_factory=dict)
    slack_api_url: str = "https://slack.com/api/"
    slack_lookup_max_pages: int = Field(default=10, ge=1, le=100)

    # Signed outcome events (clients/outcome_signing.py), on by default: workers sign what
    # they write and every folding reader refuses an unsigned outcome. The keys come from
    # DATA_DIR/keys (``ledger init`` writes a pair: clients/outcome_keys.py) unless given
    # here: the workers' Ed25519 signing key (base64 of 32 bytes; workers only), and the
    # public keys every folding reader checks worker-written events against (JSON list;
    # several during a rotation); ``ledger outcome-keys`` prints a pair. Off (false) only
    # on purpose: then anyone who may write ledger.deliveries can forge an outcome, and
    # every worker and projector says so at start.
    outcome_signing: bool = True
    outcome_signing_key: SecretStr | None = None
    outcome_verify_keys: list[str] = Field(default_factory=list)

    # Per channel, replacing fields of that channel's default policy, as JSON:
    # {"webhook": {"base_delay_s": 5, "max_attempts": 4}}
    retry_policies: dict[str, RetryPolicy] = Field(default_factory=dict)

    # Addresses a delivery may make us contact beyond the globally routable ones (events/
    # addresses.py), as JSON lists: networks (CIDR or single addresses) and host names.
    # Empty by default: loopback, private, link-local and the like are refused.
    allowed_networks: list[str] = Field(default_factory=list)
    allowed_hosts: list[str] = Field(default_factory=list)

    # Outbound HTTP (httpx): timeouts and the pool shared by all sends of one worker.
    http_connect_timeout_s: float = Field(default=2.0, gt=0)
    http_timeout_s: float = Field(default=5.0, gt=0)
    send_concurrency: int = Field(default=64, ge=1)
    # The connection pool under httpx (streams/channels/http.py): aiohttp's, or httpcore's
    # (httpx's own). Both guard addresses and writes the same way and classify alike.
    http_pool: Literal["aiohttp", "httpcore"] = "aiohttp"
    # The event loop of `ledger worker` and the CLI's publishing (ledger/event_loop.py).
    event_loop: Literal["auto", "uvloop", "asyncio"] = "asyncio"

    # Every send and every lookup ends within this many seconds, all phases together
    # (pool wait, connect, write, wait, body): the hard total deadline.
    send_deadline_s: float = Field(default=10.0, gt=0)
    # Per channel, replacing send_deadline_s for that channel's sends and lookups, as JSON:
    # {"browser": 20} (a Chromium attempt takes seconds). The lease must exceed the longest
    # deadline + clock_skew_margin_s; http_timeout_s must not exceed the shortest.
    send_deadlines: dict[str, float] = Field(default_factory=dict)
    # Clocks of two workers may disagree by this much; the lease rule allows for it.
    clock_skew_margin_s: float = Field(default=2.0, ge=0)
    # One clock for every worker (streams/broker_clock.py): each worker measures the
    # broker's clock with a heartbeat every clock_probe_interval_s and decides on it; past
    # clock_skew_limit_s off (or unmeasured for clock_stale_s) it claims, sends and times
    # nothing until its clock is back.
    clock_skew_limit_s: float = Field(default=30.0, gt=0)
    clock_probe_interval_s: float = Field(default=1.0, gt=0, le=60)
    clock_stale_s: float = Field(default=15.0, gt=0)
    # After an UNKNOWN, its receiver may still be processing the request the client gave
    # up on: the first lookup waits this long; a second "not found" is needed before a
    # retry, this long after the first.
    lookup_settle_s: float = Field(default=15.0, ge=0)
    lookup_confirm_spacing_s: float = Field(default=5.0, ge=0)
    lookup_backoff_s: float = Field(default=1.0, gt=0)
    lookup_backoff_max_s: float = Field(default=60.0, gt=0)
    # Lookups of one UNKNOWN attempt before it is left to an operator (stays UNKNOWN).
    max_lookups: int = Field(default=12, ge=2)
    # Claims a worker keeps open at once (proposed and not read back, plus sends and
    # lookups running). 0: as many as its sends can finish within a lease, learnt from
    # the sends it sees (streams/claim_budget.py): send_concurrency rounds of
    # (lease - deadline - margin) / (2 x the average send), 1 to 16 of them.
    max_open_claims: int = Field(default=0, ge=0)
    # Lookups of a SENT delivery before it becomes UNKNOWN ("polling gave up").
    max_sent_polls: int = Field(default=20, ge=1)

    # The delivery worker (streams/): consumer group, leases and timers.
    worker_group: str = "ledger-worker"
    lease_seconds: float = Field(default=30.0, gt=0)
    # How long the worker's producers (claims, changelog, outcomes) wait for company
    # before sending a batch. Each batch costs the broker a request and a replication
    # round, so a few milliseconds more per record buys a cheaper broker under load
    # (BENCHMARKS.md, issue 12 part 6); 0 sends every record at once.
    worker_linger_ms: float = Field(default=20.0, ge=0, le=1000)
    # How long the broker may hold the worker's fetch for company (up to 64 KiB) before
    # answering it; 0 answers as soon as one record is there. Each fetch answered costs
    # the broker and the worker a request (streams/transport.py).
    worker_fetch_wait_ms: float = Field(default=0.0, ge=0, le=1000)
    # Standby copies of the worker's table kept warm by other workers (faust's
    # table_standby_replicas). Each standby replays every changelog write, which costs
    # the broker and the other worker CPU on every delivery; without one, a worker taking
    # over partitions rebuilds their table from the changelog first (seconds per 100,000
    # open deliveries). Set 1 where takeover time matters more than CPU.
    worker_standby_replicas: int = Field(default=0, ge=0, le=8)
    claim_grace_seconds: float = Field(default=10.0, gt=0)
    timer_interval_seconds: float = Field(default=0.5, gt=0)
    # The worker's Prometheus endpoint (0: off; each worker on a host needs its own port).
    worker_metrics_host: str = "127.0.0.1"
    worker_metrics_port: int = Field(default=0, ge=0, le=65535)

    # The dashboard (ledger dashboard): where it listens, the bearer token it requires
    # when bound to anything but loopback, how often the page refreshes, and the
    # counter thresholds (counter name -> value at which it turns red), as JSON.
    dashboard_host: str = "127.0.0.1"
    dashboard_port: int = Field(default=8765, ge=0, le=65535)
    dashboard_token: SecretStr | None = None
    # Host names (JSON list) the dashboard answers to besides its bound address (and,
    # bound to loopback, localhost/127.0.0.1/::1): any other Host header gets 421.
    dashboard_allowed_hosts: list[str] = Field(default_factory=list)
    dashboard_refresh_seconds: float = Field(default=5.0, gt=0)
    dashboard_thresholds: dict[str, int] = Field(default_factory=dict)

    # Fault-injection points (see events/faults.py). Off unless named here.
    faults: frozenset[str] = frozenset()

    @field_validator("outcome_signing_key")
    @classmethod
    def _signing_key_parses(cls, value: SecretStr | None) -> SecretStr | None:
        if value is not None:
            key_bytes(value.get_secret_value(), SIGNING_KEY)  # ValueError: what, never the key
        return value

    @field_validator("outcome_verify_keys")
    @classmethod
    def _verify_keys_parse(cls, value: list[str]) -> list[str]:
        for key in value:
            key_bytes(key, VERIFY_KEY)
        return value

    @field_validator("slack_tokens")
    @classmethod
    def _slack_workspaces(cls, value: dict[str, SecretStr]) -> dict[str, SecretStr]:
        for workspace, token in value.items():
            if not SLACK_WORKSPACE.fullmatch(workspace):
                raise ValueError(
                    f"workspace {workspace[:64]!r} must be 1-64 letters, digits, '_' or '-'"
                )
            if not token.get_secret_value().strip():
                raise ValueError(f"the token of workspace {workspace!r} is empty")
        return value

    @field_validator("slack_api_url")
    @classmethod
    def _slack_url(cls, value: str) -> str:
        if urlsplit(value).scheme not in ("http", "https") or not urlsplit(value).hostname:
            raise ValueError("must be an http(s) URL with a host")
        return value if value.endswith("/") else value + "/"

    @field_validator("allowed_networks")
    @classmethod
    def _networks_parse(cls, value: list[str]) -> list[str]:
        for network in value:
            parse_network(network)  # ValueError names the bad entry
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

    @model_validator(mode="after")
    def _default_bootstrap(self) -> Settings:
        if not self.bootstrap_servers:
            object.__setattr__(self, "bootstrap_servers", f"{self.broker_host}:{self.broker_port}")
        return self

    @model_validator(mode="after")
    def _kafka_security(self) -> Settings:
        check_security(self)
        return self

    @model_validator(mode="after")
    def _safe_lease(self) -> Settings:
        check_lease(self)
        return self

    def deadline_for(self, channel: str) -> float:
        """The hard total deadline of one send or lookup of ``channel``."""
        return self.send_deadlines.get(channel, self.send_deadline_s)

    @property
    def longest_send_deadline_s(self) -> float:
        """The longest deadline of any channel: what budgets by the deadline plans for."""
        return max([self.send_deadline_s, *self.send_deadlines.values()])

    def topic_names(self) -> tuple[str, str, str]:
        """The three topics the ledger owns, in creation order."""
        return (self.topic_runs, self.topic_deliveries, self.topic_deadletter)


def check_security(settings: Settings) -> None:
    """Refuse Kafka security settings that cannot work, or would silently be ignored.

    Raises ValueError naming the ``LEDGER_`` variables (never a secret's value).
    """
    protocol = settings.security_protocol
    uses_sasl = protocol.startswith("SASL_")
    uses_tls = protocol in ("SSL", "SASL_SSL")
    if uses_sasl and (not settings.sasl_username or settings.sasl_password is None):
        raise ValueError(
            f"LEDGER_SECURITY_PROTOCOL={protocol} needs LEDGER_SASL_USERNAME and "
            "LEDGER_SASL_PASSWORD"
        )
    if not uses_sasl and (settings.sasl_username or settings.sasl_password is not None):
        raise ValueError(
            f"LEDGER_SASL_USERNAME/LEDGER_SASL_PASSWORD are set but LEDGER_SECURITY_PROTOCOL="
            f"{protocol} sends no credentials (use SASL_SSL)"
        )
    files = {
        "LEDGER_SSL_CAFILE": settings.ssl_cafile,
        "LEDGER_SSL_CERTFILE": settings.ssl_certfile,
        "LEDGER_SSL_KEYFILE": settings.ssl_keyfile,
    }
    given = [name for name, path in files.items() if path is not None]
    if given and not uses_tls:
        raise ValueError(
            f"{given[0]} is set but LEDGER_SECURITY_PROTOCOL={protocol} does not use TLS "
            "(use SSL or SASL_SSL)"
        )
    for name, path in files.items():
        if path is not None and not path.is_file():
            raise ValueError(f"{name}={path}: no such file")
    if settings.ssl_keyfile is not None and settings.ssl_certfile is None:
        raise ValueError("LEDGER_SSL_KEYFILE is set without LEDGER_SSL_CERTFILE")
    if settings.ssl_key_password is not None and settings.ssl_certfile is None:
        raise ValueError("LEDGER_SSL_KEY_PASSWORD is set without LEDGER_SSL_CERTFILE")


def check_lease(settings: Settings) -> None:
    """Refuse a lease too short for the lease rule: a send must fit in what is left of it.

    Every channel's deadline counts (``send_deadlines`` over ``send_deadline_s``). Raises
    ValueError naming the field and the channel (pydantic turns it into a one-line error).
    """
    for channel, deadline in settings.send_deadlines.items():
        if not deadline > 0:  # also refuses NaN
            raise ValueError(
                f"send_deadlines[{channel}]={deadline:g} must be positive "
                "(the hard total deadline of that channel's sends)"
            )
    deadlines = {
        "send_deadline_s": settings.send_deadline_s,
        **{f"send_deadlines[{ch}]": s for ch, s in settings.send_deadlines.items()},
    }
    longest = max(deadlines, key=lambda name: deadlines[name])
    needed = deadlines[longest] + settings.clock_skew_margin_s
    if settings.lease_seconds <= needed:
        raise ValueError(
            f"lease_seconds={settings.lease_seconds:g} must exceed {longest}="
            f"{deadlines[longest]:g} + clock_skew_margin_s="
            f"{settings.clock_skew_margin_s:g} (a send must end before its lease does)"
        )
    shortest = min(deadlines, key=lambda name: deadlines[name])
    if settings.http_timeout_s > deadlines[shortest]:
        raise ValueError(
            f"http_timeout_s={settings.http_timeout_s:g} must not exceed {shortest}="
            f"{deadlines[shortest]:g} (the hard total deadline bounds every phase)"
        )


def address_policy(settings: Settings) -> AddressPolicy:
    """What a delivery may make us contact: the global allow-lists, plus each webhook
    endpoint's own networks for its origin (host and port) and its lookup URL's."""
    per_origin: dict[Origin, list[str]] = {}
    for url, endpoint in settings.webhook_endpoints.items():
        if not endpoint.allowed_networks:
            continue
        for origin in (origin_of(url), origin_of(endpoint.lookup_url or "")):
            if origin is not None:
                per_origin.setdefault(origin, []).extend(endpoint.allowed_networks)
    return AddressPolicy(settings.allowed_networks, settings.allowed_hosts, per_origin)
