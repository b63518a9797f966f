"""One ``Settings`` for delivery-ledger, made of parts (config/parts.py).

The environment names a part's field as ``LEDGER_<PART>__<FIELD>``: pydantic-settings'
``env_nested_delimiter="__"``, because single underscores are already inside the field
names (``LEDGER_WORKER__LEASE_S``, ``LEDGER_KAFKA__BOOTSTRAP_SERVERS``). A whole part may
also be given as one JSON object (``LEDGER_WORKER='{"lease_s": 45}'``); its own
variables win over it. The root keeps what every part shares: the data and cache
directories, the event loop, and the fault-injection points.

Unknown fields are refused, in a part and at the root, so a stale or misspelled name is
an error, not a default silently kept (other ``LEDGER_*`` variables, such as the test
fixtures' ``LEDGER_TEST_*``, are not settings and are left alone). The flat names of
before are still read, with a warning (config/legacy.py). Every variable, with its
type, default and old name, is listed in docs/SETTINGS.md (``python -m config.table``).

Validation that spans parts lives here: the lease rule (worker lease against the
channels' deadlines) and the Kafka security checks. ``changed`` is the one way to derive
settings with other values, validated (``model_copy(update=...)`` validates nothing).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Literal, Self

from platformdirs import user_cache_dir, user_data_dir
from pydantic import BaseModel, Field, Secret, SecretStr, model_validator
from pydantic_settings import (
    BaseSettings,
    PydanticBaseSettingsSource,
    SettingsConfigDict,
)

from config.legacy import DELIMITER, PREFIX, LegacyEnvSource
from config.parts import (
    ApiSettings,
    BreakerSettings,
    ChannelSettings,
    DashboardSettings,
    EndpointSettings,
    KafkaSettings,
    ProjectionSettings,
    PublisherSettings,
    RateLimitSpec,
    SigningSettings,
    WebhookEndpoint,
    WorkerSettings,
    refuse_update,
)
from events.addresses import AddressPolicy, Origin, origin_of

__all__ = [
    "ApiSettings",
    "BreakerSettings",
    "ChannelSettings",
    "DashboardSettings",
    "KafkaSettings",
    "ProjectionSettings",
    "PublisherSettings",
    "RateLimitSpec",
    "Settings",
    "SigningSettings",
    "WebhookEndpoint",
    "WorkerSettings",
    "address_policy",
    "changed",
    "revealed",
    "settings_environment",
    "with_channel",
]


class Settings(BaseSettings):
    """Every part of delivery-ledger's configuration (env prefix ``LEDGER_``)."""

    model_config = SettingsConfigDict(
        env_prefix=PREFIX,
        env_nested_delimiter=DELIMITER,
        frozen=True,
        extra="forbid",
        hide_input_in_errors=True,
        use_attribute_docstrings=True,
    )

    kafka: KafkaSettings = Field(default_factory=KafkaSettings)
    """The brokers, Kafka security, the topics."""
    publisher: PublisherSettings = Field(default_factory=PublisherSettings)
    """The agents' publisher."""
    channels: ChannelSettings = Field(default_factory=ChannelSettings)
    """Outbound sends of every channel."""
    worker: WorkerSettings = Field(default_factory=WorkerSettings)
    """The delivery worker."""
    signing: SigningSettings = Field(default_factory=SigningSettings)
    """Signed outcome events."""
    projection: ProjectionSettings = Field(default_factory=ProjectionSettings)
    """The projections' database."""
    dashboard: DashboardSettings = Field(default_factory=DashboardSettings)
    """The dashboard."""
    api: ApiSettings = Field(default_factory=ApiSettings)
    """The HTTP ingest API."""
    endpoints: EndpointSettings = Field(default_factory=EndpointSettings)
    """The endpoint registry."""
    breaker: BreakerSettings = Field(default_factory=BreakerSettings)
    """The endpoints' circuit breakers."""

    data_dir: Path = Path(user_data_dir("delivery-ledger"))
    """Where keys, the local broker's data and the default SQLite projection live."""
    cache_dir: Path = Path(user_cache_dir("delivery-ledger"))
    """Where downloads (the Kafka distribution) are kept."""
    event_loop: Literal["auto", "uvloop", "asyncio"] = "asyncio"
    """The event loop of ``ledger worker`` and the CLI's publishing (ledger/event_loop.py)."""
    faults: frozenset[str] = frozenset()
    """Fault-injection points (events/faults.py), as a JSON list. Off unless named here."""

    def model_copy(self, *, update: Mapping[str, Any] | None = None, deep: bool = False) -> Self:
        """A plain copy; with ``update``, TypeError: use ``changed``, which validates."""
        refuse_update(update)
        return super().model_copy(deep=deep)

    @classmethod
    def settings_customise_sources(
        cls,
        settings_cls: type[BaseSettings],
        init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource,
        dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        """Under the new variables, the old flat names (config/legacy.py)."""
        return (
            init_settings,
            env_settings,
            LegacyEnvSource(settings_cls),
            dotenv_settings,
            file_secret_settings,
        )

    @model_validator(mode="after")
    def _default_bootstrap(self) -> Settings:
        kafka = self.kafka
        if not kafka.bootstrap_servers:
            address = f"{kafka.broker_host}:{kafka.broker_port}"
            object.__setattr__(kafka, "bootstrap_servers", address)
        return self

    @model_validator(mode="after")
    def _kafka_security(self) -> Settings:
        check_security(self.kafka)
        return self

    @model_validator(mode="after")
    def _safe_lease(self) -> Settings:
        check_lease(self.worker, self.channels)
        return self


_PARTS = frozenset(
    name
    for name, field in Settings.model_fields.items()
    if isinstance(field.annotation, type) and issubclass(field.annotation, BaseModel)
)


def changed(settings: Settings, changes: Mapping[str, object]) -> Settings:
    """``settings`` with ``changes`` (dotted names: ``{"worker.lease_s": 3}``), validated.

    A name that is not a field raises ``KeyError`` naming it; values are validated as if
    read from the environment's parsed form, with every cross-part rule.
    """
    data = settings.model_dump(mode="python", round_trip=True)
    for dotted, value in changes.items():
        names = dotted.split(".")
        model: type[BaseModel] = Settings
        tree: dict[str, Any] = data
        for depth, name in enumerate(names):
            if name not in model.model_fields:
                raise KeyError(f"{dotted}: {name!r} is not a field of {model.__name__}")
            if depth == len(names) - 1:
                tree[name] = value
                break
            part = model.model_fields[name].annotation
            if not (isinstance(part, type) and issubclass(part, BaseModel)):
                raise KeyError(f"{dotted}: {name!r} is not a part")
            model = part
            tree = tree[name]
    return Settings.model_validate(data)


def with_channel(settings: Settings, channel: str, entry: Mapping[str, object]) -> Settings:
    """``settings`` with ``entry``'s keys set in ``channel``'s entry of
    ``channels.settings`` (the others kept), validated like ``changed``; the channel's
    plugin validates the entry when its adapter is built (config/channels.py)."""
    current = settings.channels.settings.get(channel)
    merged = {**(current.get_secret_value() if current is not None else {}), **entry}
    entries = {**settings.channels.settings, channel: Secret(merged)}
    return changed(settings, {"channels.settings": entries})


def _revealed(value: object) -> object:
    # model_dump(mode="json") writes secrets as asterisks: a child must get the values.
    if isinstance(value, SecretStr | Secret):
        return _revealed(value.get_secret_value())
    if isinstance(value, dict):
        return {key: _revealed(item) for key, item in value.items()}
    if isinstance(value, list | tuple):
        return [_revealed(item) for item in value]
    if isinstance(value, frozenset | set):
        return sorted(_revealed(item) for item in value)  # type: ignore[type-var]
    if isinstance(value, Path):
        return str(value)
    return value


def revealed(settings: Settings) -> dict[str, Any]:
    """Every value of ``settings`` as plain JSON-able data, secrets in the clear (for a
    child process, never a log)."""
    plain = _revealed(settings.model_dump(mode="python", round_trip=True))
    assert isinstance(plain, dict)
    return plain


def settings_environment(settings: Settings) -> dict[str, str]:
    """The ``LEDGER_*`` variables under which another process reads exactly ``settings``
    (secrets in the clear: for a child's environment, never a log): one variable per
    field (``LEDGER_WORKER__LEASE_S``), JSON where the value is a list or a map; a field
    that is None is left out (every such field's default)."""
    env: dict[str, str] = {}

    def put(name: str, shown: object) -> None:
        if shown is None:
            return
        text = shown if isinstance(shown, str) else json.dumps(shown)
        env[PREFIX + name.upper()] = text

    for name, value in revealed(settings).items():
        if name in _PARTS:
            for field, inner in value.items():
                put(f"{name}{DELIMITER}{field}", inner)
        else:
            put(name, value)
    return env


def check_security(settings: KafkaSettings) -> None:
    """Refuse Kafka security settings that cannot work, or would silently be ignored.

    Raises ValueError naming the ``LEDGER_`` variables (never a secret's value).
    """
    protocol = settings.security_protocol
    uses_sasl = protocol.startswith("SASL_")
    uses_tls = protocol in ("SSL", "SASL_SSL")
    if uses_sasl and (not settings.sasl_username or settings.sasl_password is None):
        raise ValueError(
            f"LEDGER_KAFKA__SECURITY_PROTOCOL={protocol} needs LEDGER_KAFKA__SASL_USERNAME and "
            "LEDGER_KAFKA__SASL_PASSWORD"
        )
    if not uses_sasl and (settings.sasl_username or settings.sasl_password is not None):
        raise ValueError(
            "LEDGER_KAFKA__SASL_USERNAME/LEDGER_KAFKA__SASL_PASSWORD are set but "
            f"LEDGER_KAFKA__SECURITY_PROTOCOL={protocol} sends no credentials (use SASL_SSL)"
        )
    files = {
        "LEDGER_KAFKA__SSL_CAFILE": settings.ssl_cafile,
        "LEDGER_KAFKA__SSL_CERTFILE": settings.ssl_certfile,
        "LEDGER_KAFKA__SSL_KEYFILE": settings.ssl_keyfile,
    }
    given = [name for name, path in files.items() if path is not None]
    if given and not uses_tls:
        raise ValueError(
            f"{given[0]} is set but LEDGER_KAFKA__SECURITY_PROTOCOL={protocol} does not use TLS "
            "(use SSL or SASL_SSL)"
        )
    for name, path in files.items():
        if path is not None and not path.is_file():
            raise ValueError(f"{name}={path}: no such file")
    if settings.ssl_keyfile is not None and settings.ssl_certfile is None:
        raise ValueError("LEDGER_KAFKA__SSL_KEYFILE is set without LEDGER_KAFKA__SSL_CERTFILE")
    if settings.ssl_key_password is not None and settings.ssl_certfile is None:
        raise ValueError("LEDGER_KAFKA__SSL_KEY_PASSWORD is set without LEDGER_KAFKA__SSL_CERTFILE")


def check_lease(worker: WorkerSettings, channels: ChannelSettings) -> None:
    """Refuse a lease too short for the lease rule: a send must fit in what is left of it.

    Every channel's deadline counts (``send_deadlines`` over ``send_deadline_s``). Raises
    ValueError naming the field and the channel (pydantic turns it into a one-line error).
    """
    for channel, deadline in channels.send_deadlines.items():
        if not deadline > 0:  # also refuses NaN
            raise ValueError(
                f"channels.send_deadlines[{channel}]={deadline:g} must be positive "
                "(the hard total deadline of that channel's sends)"
            )
    deadlines = {
        "channels.send_deadline_s": channels.send_deadline_s,
        **{f"channels.send_deadlines[{ch}]": s for ch, s in channels.send_deadlines.items()},
    }
    longest = max(deadlines, key=lambda name: deadlines[name])
    needed = deadlines[longest] + worker.clock_skew_margin_s
    if worker.lease_s <= needed:
        raise ValueError(
            f"worker.lease_s={worker.lease_s:g} must exceed {longest}="
            f"{deadlines[longest]:g} + worker.clock_skew_margin_s="
            f"{worker.clock_skew_margin_s:g} (a send must end before its lease does)"
        )
    shortest = min(deadlines, key=lambda name: deadlines[name])
    if channels.http_timeout_s > deadlines[shortest]:
        raise ValueError(
            f"channels.http_timeout_s={channels.http_timeout_s:g} must not exceed {shortest}="
            f"{deadlines[shortest]:g} (the hard total deadline bounds every phase)"
        )


def address_policy(settings: ChannelSettings) -> AddressPolicy:
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
