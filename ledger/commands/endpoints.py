"""``ledger endpoints``: the endpoint registry (events/endpoints.py) from the command line.

Thin: read the registry to its end, ask the pure decision what the command does to the
endpoint, append the one event, print. Secrets are printed once, when this command
generated them, and never otherwise; ``show`` and ``list`` say how many secrets sign.
"""

from __future__ import annotations

import asyncio
import getpass
import json
from datetime import UTC, datetime, timedelta
from typing import Annotated, Any

import typer
from pydantic import SecretStr, ValidationError
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from clients.endpoint_registry import append_endpoint_event, read_events, read_registry
from clients.endpoint_secrets import SecretBox, SecretUnreadable, new_webhook_secret
from clients.operator_actions import check_operator, check_reason
from config.settings import Settings
from events.endpoints import (
    EndpointEvent,
    EndpointRefused,
    EndpointSecret,
    EndpointSpec,
    EndpointState,
    check_endpoint_id,
    disable,
    enable,
    finish_rotation,
    pause,
    reencrypt,
    register,
    resume,
    rotate_secret,
    update,
)
from events.errors import LedgerError
from events.retry_policy import for_channel
from ledger.commands.operator_options import OperatorName as Operator
from ledger.commands.operator_options import Reason
from ledger.errors import UsageError
from streams.channels.endpoints import endpoint_prefix
from streams.channels.signature import signer

out = Console(highlight=False, soft_wrap=True)
app = typer.Typer(no_args_is_help=True, help="The endpoint registry (ledger.endpoints).")

PRODUCER = "ledger-cli/endpoints"

Id = Annotated[str, typer.Argument(help="The endpoint's id (lowercase letters, digits, ._-).")]
AsJson = Annotated[bool, typer.Option("--json", help="Print JSON instead of a table.")]
Channel = Annotated[
    str | None, typer.Option("--channel", help="webhook, slack, smtp, email_api, browser, ...")
]
Address = Annotated[
    str | None,
    typer.Option(
        "--address",
        help="webhook: URL prefix (https://host/hooks/); other channels: the recipient exactly.",
    ),
]
LookupUrl = Annotated[str | None, typer.Option("--lookup-url", help="The receiver's lookup URL.")]
Dedupes = Annotated[
    bool | None,
    typer.Option(
        "--receiver-dedupes/--no-receiver-dedupes",
        help="The receiver's owner declares it dedupes on webhook-id (never assumed).",
        show_default=False,
    ),
]
SettleS = Annotated[float | None, typer.Option("--settle-s", help="Settle window, seconds.")]
RetryPolicyJson = Annotated[
    str | None,
    typer.Option("--retry-policy", help='JSON, replacing fields: {"max_attempts": 4}.'),
]
RateLimit = Annotated[
    float | None,
    typer.Option("--rate-limit", help="Deliveries per second to it, all workers together."),
]
SloS = Annotated[int | None, typer.Option("--slo-s", help="The endpoint's SLO, seconds.")]
Secret = Annotated[
    str | None,
    typer.Option(
        "--secret",
        envvar="LEDGER_ENDPOINT_SECRET",
        help="A whsec_ secret to use (default for webhooks: one is generated and printed "
        "once). Prefer the LEDGER_ENDPOINT_SECRET variable: arguments show in ps.",
        show_default=False,
    ),
]


def _settings() -> Settings:
    return Settings()


def _actor(name: str | None, settings: Settings, *, required: bool = False) -> str:
    name = name or settings.endpoints.operator
    if not name and not required:
        name = getpass.getuser()
    return check_operator(name)


def _box(settings: Settings) -> SecretBox:
    box = SecretBox.of(settings.endpoints)
    if box is None:
        raise UsageError(
            "no endpoint encryption key: secrets are never written in clear",
            "set LEDGER_ENDPOINTS__ENCRYPTION_KEYS to a JSON list of Fernet keys; make one "
            "with: python -c 'import base64,os; print(base64.urlsafe_b64encode(os.urandom(32))"
            ".decode())'",
        )
    return box


def _registry(settings: Settings) -> dict[str, EndpointState]:
    return asyncio.run(read_registry(settings.kafka))


def _one(settings: Settings, endpoint_id: str) -> EndpointState:
    _checked_id(endpoint_id)
    found = _registry(settings).get(endpoint_id)
    if found is None:
        raise UsageError(
            f"no endpoint {endpoint_id!r} in the registry", "'ledger endpoints list' shows them"
        )
    return found


def _checked_id(endpoint_id: str) -> str:
    try:
        return check_endpoint_id(endpoint_id)
    except ValueError as exc:
        raise UsageError(f"endpoint id {endpoint_id!r}: {exc}", "e.g. 'acme-hooks'") from None


def _append(settings: Settings, event: EndpointEvent) -> None:
    asyncio.run(append_endpoint_event(settings.kafka, event))


def _decided(make: Any, *args: Any, **kwargs: Any) -> Any:
    try:
        return make(*args, **kwargs)
    except EndpointRefused as exc:
        raise UsageError(str(exc), exc.hint) from None


def _checked_secret(secret: str) -> str:
    try:
        signer(SecretStr(secret))
    except ValueError as exc:
        raise UsageError(
            f"--secret: {exc}", "a Standard Webhooks secret is 'whsec_' followed by base64"
        ) from None
    return secret


def _spec(base: dict[str, Any], **given: Any) -> EndpointSpec:
    data = {**base, **{k: v for k, v in given.items() if v is not None}}
    if given.get("retry_policy") is not None:
        try:
            fields = json.loads(given["retry_policy"])
        except ValueError:
            raise UsageError(
                "--retry-policy is not JSON", "--retry-policy '{\"max_attempts\": 4}'"
            ) from None
        if not isinstance(fields, dict):
            raise UsageError(
                "--retry-policy is not a JSON object", "--retry-policy '{\"max_attempts\": 4}'"
            )
        data["retry_policy"] = for_channel(str(data.get("channel")), fields)
    try:
        spec = EndpointSpec.model_validate(data)
    except (ValidationError, ValueError) as exc:
        first = (
            exc.errors()[0] if isinstance(exc, ValidationError) else {"loc": (), "msg": str(exc)}
        )
        where = "--" + "-".join(str(p) for p in first["loc"]).replace("_", "-")
        raise UsageError(f"{where}: {first['msg']}", "'ledger endpoints add --help'") from None
    if spec.channel == "webhook":
        try:
            endpoint_prefix(spec.address)
        except ValueError as exc:
            raise UsageError(
                f"--address {exc}", "a webhook address is a URL prefix: https://host/hooks/"
            ) from None
    return spec


def _row(state: EndpointState, now: datetime) -> dict[str, Any]:
    stop = state.disabled or state.paused
    return {
        "id": state.endpoint_id,
        "channel": state.spec.channel,
        "address": state.spec.address,
        "state": state.state,
        "circuit": state.circuit,
        "by": stop.by if stop else None,
        "reason": stop.reason if stop else None,
        "since": stop.at.isoformat() if stop else None,
        "signing_secrets": len(state.active_secrets(now)),
        "version": state.version,
    }


def _detail(state: EndpointState, now: datetime) -> dict[str, Any]:
    return {
        **_row(state, now),
        "lookup_url": state.spec.lookup_url,
        "receiver_dedupes": state.spec.receiver_dedupes,
        "settle_s": state.spec.settle_s,
        "retry_policy": state.spec.retry_policy.model_dump() if state.spec.retry_policy else None,
        "rate_limit_per_s": state.spec.rate_limit_per_s,
        "slo_s": state.spec.slo_s,
        "paused": state.paused.model_dump(mode="json") if state.paused else None,
        "disabled": state.disabled.model_dump(mode="json") if state.disabled else None,
        "breaker": state.breaker.model_dump(mode="json") if state.breaker else None,
        # Never the secrets: when each was added and until when it signs.
        "secrets": [
            {
                "added_at": s.added_at.isoformat(),
                "expires_at": s.expires_at.isoformat() if s.expires_at else None,
                "active": s.active(now),
            }
            for s in state.secrets
        ],
        "registered_at": state.registered_at.isoformat(),
        "updated_at": state.updated_at.isoformat(),
    }


@app.command("add")
def add_command(
    endpoint_id: Id,
    channel: Channel = None,
    address: Address = None,
    lookup_url: LookupUrl = None,
    receiver_dedupes: Dedupes = None,
    settle_s: SettleS = None,
    retry_policy: RetryPolicyJson = None,
    rate_limit: RateLimit = None,
    slo_s: SloS = None,
    secret: Secret = None,
    no_secret: Annotated[
        bool, typer.Option("--no-secret", help="webhook: sign with the global secret.")
    ] = False,
    actor: Operator = None,
) -> None:
    """Register an endpoint (a webhook one gets a generated secret, printed once)."""
    _checked_id(endpoint_id)
    if not channel or not address:
        raise UsageError(
            "add needs --channel and --address",
            "ledger endpoints add ID --channel webhook --address https://host/hooks/",
        )
    spec = _spec(
        {},
        channel=channel,
        address=address,
        lookup_url=lookup_url,
        receiver_dedupes=receiver_dedupes,
        settle_s=settle_s,
        retry_policy=retry_policy,
        rate_limit_per_s=rate_limit,
        slo_s=slo_s,
    )
    settings = _settings()
    who = _actor(actor, settings)
    now = datetime.now(UTC)
    generated = None
    secrets: tuple[EndpointSecret, ...] = ()
    if secret is not None and no_secret:
        raise UsageError("--secret and --no-secret exclude each other", "choose one")
    if spec.channel == "webhook" and not no_secret:
        if secret is None:
            secret = generated = new_webhook_secret()
        secrets = (
            EndpointSecret(
                ciphertext=_box(settings).encrypt(_checked_secret(secret)), added_at=now
            ),
        )
    elif secret is not None:
        raise UsageError("--secret is for webhook endpoints", "leave it out for this channel")
    registry = _registry(settings)
    event = _decided(
        register,
        endpoint_id,
        spec,
        secrets,
        actor=who,
        producer=PRODUCER,
        at=now,
        existing=registry.get(endpoint_id),
    )
    _append(settings, event)
    out.print(f"registered endpoint {escape(endpoint_id)} ({spec.channel} {escape(spec.address)})")
    if generated is not None:
        out.print(f"signing secret (shown once, give it to the receiver): {generated}")


@app.command("update")
def update_command(
    endpoint_id: Id,
    address: Address = None,
    lookup_url: LookupUrl = None,
    receiver_dedupes: Dedupes = None,
    settle_s: SettleS = None,
    retry_policy: RetryPolicyJson = None,
    rate_limit: RateLimit = None,
    slo_s: SloS = None,
    actor: Operator = None,
) -> None:
    """Change what an endpoint is or declares (the options given; the rest stays)."""
    settings = _settings()
    state = _one(settings, endpoint_id)
    spec = _spec(
        state.spec.model_dump(),
        address=address,
        lookup_url=lookup_url,
        receiver_dedupes=receiver_dedupes,
        settle_s=settle_s,
        retry_policy=retry_policy,
        rate_limit_per_s=rate_limit,
        slo_s=slo_s,
    )
    if spec == state.spec:
        raise UsageError(
            "nothing to change", "give the options to change: 'ledger endpoints update --help'"
        )
    event = _decided(
        update, state, spec, actor=_actor(actor, settings), producer=PRODUCER, at=datetime.now(UTC)
    )
    _append(settings, event)
    out.print(f"updated endpoint {escape(endpoint_id)}: {', '.join(event.changed)}")


def _stop(decide: Any, endpoint_id: str, reason: str | None, actor: str | None) -> None:
    """Pause or disable: a reason and a named operator are required."""
    why, settings = check_reason(reason), _settings()
    who = _actor(actor, settings, required=True)
    state = _one(settings, endpoint_id)
    _append(
        settings, _decided(decide, state, why, actor=who, producer=PRODUCER, at=datetime.now(UTC))
    )


def _release(decide: Any, endpoint_id: str, actor: str | None) -> None:
    """Resume or enable."""
    settings = _settings()
    state = _one(settings, endpoint_id)
    who = _actor(actor, settings)
    _append(settings, _decided(decide, state, actor=who, producer=PRODUCER, at=datetime.now(UTC)))


@app.command("pause")
def pause_command(endpoint_id: Id, reason: Reason = None, actor: Operator = None) -> None:
    """Hold the endpoint's deliveries (PENDING, waiting: paused) until it is resumed."""
    _stop(pause, endpoint_id, reason, actor)
    out.print(
        f"paused endpoint {escape(endpoint_id)}: its deliveries wait until "
        "'ledger endpoints resume'"
    )


@app.command("resume")
def resume_command(endpoint_id: Id, actor: Operator = None) -> None:
    """Release a paused endpoint's deliveries, in request order."""
    _release(resume, endpoint_id, actor)
    out.print(f"resumed endpoint {escape(endpoint_id)}")


@app.command("disable")
def disable_command(endpoint_id: Id, reason: Reason = None, actor: Operator = None) -> None:
    """Hold the endpoint's deliveries (PENDING, waiting: disabled) until it is enabled."""
    _stop(disable, endpoint_id, reason, actor)
    out.print(
        f"disabled endpoint {escape(endpoint_id)}: its deliveries wait until "
        "'ledger endpoints enable'"
    )


@app.command("enable")
def enable_command(endpoint_id: Id, actor: Operator = None) -> None:
    """Release a disabled endpoint's deliveries, in request order."""
    _release(enable, endpoint_id, actor)
    out.print(f"enabled endpoint {escape(endpoint_id)}")


@app.command("rotate-secret")
def rotate_secret_command(
    endpoint_id: Id,
    secret: Secret = None,
    overlap_s: Annotated[
        float | None,
        typer.Option(
            "--overlap-s",
            help="How long the old secret keeps signing "
            "(default: LEDGER_ENDPOINTS__ROTATION_OVERLAP_S).",
        ),
    ] = None,
    finish: Annotated[bool, typer.Option("--finish", help="Drop the old secrets now.")] = False,
    actor: Operator = None,
) -> None:
    """A new signing secret; both sign during the overlap, then only the new one."""
    settings = _settings()
    state = _one(settings, endpoint_id)
    if state.spec.channel != "webhook":
        raise UsageError(
            f"endpoint {endpoint_id!r} is a {state.spec.channel} endpoint",
            "only webhook endpoints have signing secrets",
        )
    who, now = _actor(actor, settings), datetime.now(UTC)
    if finish:
        if secret is not None or overlap_s is not None:
            raise UsageError(
                "--finish takes no --secret or --overlap-s",
                "ledger endpoints rotate-secret ID --finish",
            )
        _append(settings, _decided(finish_rotation, state, actor=who, producer=PRODUCER, at=now))
        out.print(f"endpoint {escape(endpoint_id)}: only the newest secret signs now")
        return
    if overlap_s is not None and overlap_s < 0:
        raise UsageError("--overlap-s must not be negative", "e.g. --overlap-s 86400")
    generated = None
    if secret is None:
        secret = generated = new_webhook_secret()
    new = EndpointSecret(ciphertext=_box(settings).encrypt(_checked_secret(secret)), added_at=now)
    overlap = timedelta(
        seconds=settings.endpoints.rotation_overlap_s if overlap_s is None else overlap_s
    )
    _append(
        settings, _decided(rotate_secret, state, new, overlap, actor=who, producer=PRODUCER, at=now)
    )
    out.print(
        f"endpoint {escape(endpoint_id)}: new secret signs now, the old one until "
        f"{(now + overlap).isoformat(timespec='seconds')}"
    )
    if generated is not None:
        out.print(f"new signing secret (shown once, give it to the receiver): {generated}")


@app.command("reencrypt")
def reencrypt_command(actor: Operator = None) -> None:
    """Re-encrypt every endpoint's secrets under the first encryption key (after a new key
    was put first in LEDGER_ENDPOINTS__ENCRYPTION_KEYS)."""
    settings = _settings()
    box, who, now = _box(settings), _actor(actor, settings), datetime.now(UTC)
    changed = 0
    for state in _registry(settings).values():
        try:
            secrets = tuple(
                s.model_copy(update={"ciphertext": box.reencrypted(s.ciphertext)})
                for s in state.secrets
            )
        except SecretUnreadable as exc:
            raise LedgerError(
                f"endpoint {state.endpoint_id}: {exc}",
                "keep the old key in LEDGER_ENDPOINTS__ENCRYPTION_KEYS until every endpoint "
                "is re-encrypted",
            ) from None
        if secrets != state.secrets:
            _append(settings, reencrypt(state, secrets, actor=who, producer=PRODUCER, at=now))
            changed += 1
    out.print(f"re-encrypted the secrets of {changed} endpoint(s)")


@app.command("list")
def list_command(as_json: AsJson = False) -> None:
    """Every endpoint, its state and its circuit breaker's."""
    now = datetime.now(UTC)
    rows = [
        _row(s, now) for s in sorted(_registry(_settings()).values(), key=lambda s: s.endpoint_id)
    ]
    if as_json:
        out.print_json(json.dumps(rows))
        return
    table = Table("id", "channel", "address", "state", "circuit", "by", "reason", "secrets")
    columns = ("id", "channel", "address", "state", "circuit", "by", "reason", "signing_secrets")
    for row in rows:
        table.add_row(*(escape(str(row[k] if row[k] is not None else "")) for k in columns))
    out.print(table)


@app.command("show")
def show_command(endpoint_id: Id, as_json: AsJson = False) -> None:
    """One endpoint: what it declares, its state, its secrets' dates (never the secrets)."""
    detail = _detail(_one(_settings(), endpoint_id), datetime.now(UTC))
    if as_json:
        out.print_json(json.dumps(detail))
        return
    for name, value in detail.items():
        out.print(
            f"{name}: "
            f"{escape(json.dumps(value) if isinstance(value, (dict, list)) else str(value))}"
        )


@app.command("history")
def history_command(endpoint_id: Id) -> None:
    """The endpoint's events still in the log (the topic is compacted: the latest at least)."""
    settings = _settings()
    _checked_id(endpoint_id)
    for event in asyncio.run(read_events(settings.kafka)):
        if event.endpoint_id == endpoint_id:
            why = getattr(event, "reason", None)
            out.print(
                f"{event.occurred_at.isoformat(timespec='seconds')} {event.type} "
                f"by {escape(event.actor)}" + (f": {escape(why)}" if why else "")
            )
