"""The flat ``LEDGER_*`` names settings had before they came in parts, still read.

Each old variable maps to one new place (``LEDGER_LEASE_SECONDS`` ->
``LEDGER_WORKER__LEASE_S``); the ``_ms`` ones are converted to seconds. An old name that
is set gives one ``DeprecatedSettingWarning`` naming the new variable; where the new one
is set too, the new one wins and the warning says the old one was ignored. Old names are
read from the environment only: code and tests use the new layout.

The source sits under the environment in priority (``Settings.settings_customise_sources``),
so the merge itself already lets a new variable win; the check here only words the warning.
"""

from __future__ import annotations

import json
import os
import warnings
from dataclasses import dataclass
from typing import Any

from pydantic.fields import FieldInfo
from pydantic_settings import BaseSettings, PydanticBaseSettingsSource

PREFIX = "LEDGER_"
DELIMITER = "__"


class DeprecatedSettingWarning(DeprecationWarning):
    """An old flat ``LEDGER_*`` variable was read; the message names its new variable."""


@dataclass(frozen=True)
class Moved:
    """Where one old variable's value now lives."""

    path: tuple[str, ...]  # field names from the root: ("worker", "lease_s")
    json: bool = False  # the value is JSON (a dict, a list)
    scale: float | None = None  # multiply by this (milliseconds -> seconds: 0.001)

    @property
    def variable(self) -> str:
        """The new environment variable (for a channel's entry: the part's variable)."""
        if self.path[:2] == ("channels", "settings"):
            return f"{PREFIX}CHANNELS{DELIMITER}SETTINGS (entry {'.'.join(self.path[2:])})"
        return PREFIX + DELIMITER.join(self.path).upper()


def _to(*path: str, json: bool = False, scale: float | None = None) -> Moved:
    return Moved(path, json, scale)


MS = 0.001

# Every flat name of the old ``Settings``, by its old field name.
MOVED: dict[str, Moved] = {
    "broker_host": _to("kafka", "broker_host"),
    "broker_port": _to("kafka", "broker_port"),
    "controller_port": _to("kafka", "controller_port"),
    "bootstrap_servers": _to("kafka", "bootstrap_servers"),
    "kafka_version": _to("kafka", "version"),
    "security_protocol": _to("kafka", "security_protocol"),
    "sasl_mechanism": _to("kafka", "sasl_mechanism"),
    "sasl_username": _to("kafka", "sasl_username"),
    "sasl_password": _to("kafka", "sasl_password"),
    "ssl_cafile": _to("kafka", "ssl_cafile"),
    "ssl_certfile": _to("kafka", "ssl_certfile"),
    "ssl_keyfile": _to("kafka", "ssl_keyfile"),
    "ssl_key_password": _to("kafka", "ssl_key_password"),
    "broker_sasl_ssl_port": _to("kafka", "broker_sasl_ssl_port"),
    "topic_runs": _to("kafka", "topic_runs"),
    "topic_deliveries": _to("kafka", "topic_deliveries"),
    "topic_deadletter": _to("kafka", "topic_deadletter"),
    "topic_heartbeats": _to("kafka", "topic_heartbeats"),
    "partitions": _to("kafka", "partitions"),
    "producer_name": _to("publisher", "producer_name"),
    "max_payload_bytes": _to("publisher", "max_payload_bytes"),
    "default_slo_seconds": _to("publisher", "default_slo_s"),
    "publisher_transaction_timeout_ms": _to("publisher", "transaction_timeout_s", scale=MS),
    "publisher_max_runs_per_transaction": _to("publisher", "max_runs_per_transaction"),
    "publisher_max_transaction_bytes": _to("publisher", "max_transaction_bytes"),
    "publisher_linger_ms": _to("publisher", "linger_s", scale=MS),
    "webhook_secret": _to("channels", "webhook_secret"),
    "webhook_endpoints": _to("channels", "webhook_endpoints", json=True),
    "channel_settings": _to("channels", "settings", json=True),
    "slack_tokens": _to("channels", "settings", "slack", "tokens", json=True),
    "slack_api_url": _to("channels", "settings", "slack", "api_url"),
    "slack_lookup_max_pages": _to("channels", "settings", "slack", "lookup_max_pages"),
    "retry_policies": _to("channels", "retry_policies", json=True),
    "allowed_networks": _to("channels", "allowed_networks", json=True),
    "allowed_hosts": _to("channels", "allowed_hosts", json=True),
    "http_connect_timeout_s": _to("channels", "http_connect_timeout_s"),
    "http_timeout_s": _to("channels", "http_timeout_s"),
    "send_concurrency": _to("channels", "send_concurrency"),
    "http_pool": _to("channels", "http_pool"),
    "send_deadline_s": _to("channels", "send_deadline_s"),
    "send_deadlines": _to("channels", "send_deadlines", json=True),
    "outcome_signing": _to("signing", "outcomes"),
    "outcome_signing_key": _to("signing", "signing_key"),
    "outcome_verify_keys": _to("signing", "verify_keys", json=True),
    "worker_group": _to("worker", "group"),
    "lease_seconds": _to("worker", "lease_s"),
    "claim_grace_seconds": _to("worker", "claim_grace_s"),
    "timer_interval_seconds": _to("worker", "timer_interval_s"),
    "worker_linger_ms": _to("worker", "linger_s", scale=MS),
    "worker_fetch_wait_ms": _to("worker", "fetch_wait_s", scale=MS),
    "worker_standby_replicas": _to("worker", "standby_replicas"),
    "worker_metrics_host": _to("worker", "metrics_host"),
    "worker_metrics_port": _to("worker", "metrics_port"),
    "clock_skew_margin_s": _to("worker", "clock_skew_margin_s"),
    "clock_skew_limit_s": _to("worker", "clock_skew_limit_s"),
    "clock_probe_interval_s": _to("worker", "clock_probe_interval_s"),
    "clock_stale_s": _to("worker", "clock_stale_s"),
    "lookup_settle_s": _to("worker", "lookup_settle_s"),
    "lookup_confirm_spacing_s": _to("worker", "lookup_confirm_spacing_s"),
    "lookup_backoff_s": _to("worker", "lookup_backoff_s"),
    "lookup_backoff_max_s": _to("worker", "lookup_backoff_max_s"),
    "max_lookups": _to("worker", "max_lookups"),
    "max_open_claims": _to("worker", "max_open_claims"),
    "max_sent_polls": _to("worker", "max_sent_polls"),
    "dashboard_host": _to("dashboard", "host"),
    "dashboard_port": _to("dashboard", "port"),
    "dashboard_token": _to("dashboard", "token"),
    "dashboard_allowed_hosts": _to("dashboard", "allowed_hosts", json=True),
    "dashboard_refresh_seconds": _to("dashboard", "refresh_s"),
    "dashboard_thresholds": _to("dashboard", "thresholds", json=True),
    # Read by the CLI's --dsn before it was a setting.
    "projection_dsn": _to("projection", "dsn"),
}


# The root's fields (config/settings.py): its parts and the fields every part shares.
ROOT_FIELDS = frozenset(
    {"kafka", "publisher", "channels", "worker", "signing", "projection", "dashboard"}
    | {"endpoints", "breaker", "api"}
    | {"data_dir", "cache_dir", "event_loop", "faults"}
)


def old_variable(name: str) -> str:
    """The old environment variable of a flat field name."""
    return PREFIX + name.upper()


def is_settings_variable(name: str) -> bool:
    """Is ``name`` a settings variable, new (``LEDGER_WORKER__LEASE_S``, ``LEDGER_WORKER``)
    or old (``LEDGER_LEASE_SECONDS``)? Other ``LEDGER_*`` names (``LEDGER_TEST_*``) are not."""
    upper = name.upper()
    if not upper.startswith(PREFIX):
        return False
    field = upper.removeprefix(PREFIX).split(DELIMITER)[0].lower()
    return field in ROOT_FIELDS or field in MOVED


def old_names_by_path() -> dict[tuple[str, ...], str]:
    """New field path -> old variable, for the settings table."""
    return {moved.path: old_variable(name) for name, moved in MOVED.items()}


def _value(raw: str, moved: Moved) -> object:
    # Unparseable text passes through unchanged: the new field's validation then names it.
    if moved.json:
        try:
            return json.loads(raw)
        except ValueError:
            return raw
    if moved.scale is not None:
        try:
            return float(raw) * moved.scale
        except ValueError:
            return raw
    return raw


def _new_is_set(environ: dict[str, str], moved: Moved) -> bool:
    # The new variable itself, or a variable higher up given as JSON with this field in
    # it (LEDGER_CHANNELS__SETTINGS='{"slack": {"tokens": ...}}', LEDGER_WORKER='{...}').
    for depth in range(len(moved.path), 0, -1):
        raw = environ.get(PREFIX + DELIMITER.join(moved.path[:depth]).upper())
        if raw is None:
            continue
        if depth == len(moved.path):
            return True
        try:
            found: Any = json.loads(raw)
            for name in moved.path[depth:]:
                found = found[name]
        except (ValueError, KeyError, TypeError):
            continue
        return True
    return False


def _set(tree: dict[str, Any], path: tuple[str, ...], value: object) -> None:
    for name in path[:-1]:
        tree = tree.setdefault(name, {})
    tree[path[-1]] = value


class LegacyEnvSource(PydanticBaseSettingsSource):
    """Reads the old flat ``LEDGER_*`` variables into the nested layout, with a warning."""

    def __init__(self, settings_cls: type[BaseSettings]) -> None:
        super().__init__(settings_cls)

    def get_field_value(self, field: FieldInfo, field_name: str) -> tuple[Any, str, bool]:
        """Unused: ``__call__`` reads every old name at once."""
        del field
        return None, field_name, False

    def __call__(self) -> dict[str, Any]:
        """The nested values the old variables give (none: an empty dict)."""
        environ = {name.upper(): value for name, value in os.environ.items()}
        tree: dict[str, Any] = {}
        for name, moved in MOVED.items():
            raw = environ.get(old_variable(name))
            if raw is None:
                continue
            if _new_is_set(environ, moved):
                warnings.warn(
                    f"{old_variable(name)} is deprecated and ignored: {moved.variable} is "
                    "set too and wins; unset the old one",
                    DeprecatedSettingWarning,
                    stacklevel=2,
                )
                continue
            scaled = " (milliseconds, now seconds)" if moved.scale is not None else ""
            warnings.warn(
                f"{old_variable(name)} is deprecated: set {moved.variable}{scaled} instead",
                DeprecatedSettingWarning,
                stacklevel=2,
            )
            _set(tree, moved.path, _value(raw, moved))
        return tree
