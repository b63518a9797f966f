"""Endpoints as events: the registry on the compacted ``ledger.endpoints`` topic.

An endpoint is where deliveries of one channel go (a webhook URL prefix, a Slack channel,
a mailbox, a browser target name), with what its owner declares about it (a lookup URL,
that its receiver dedupes), its retry policy override, its rate limit and SLO, its
signing secrets, and whether an operator paused or disabled it.

The topic is compacted and keyed by endpoint id, so only the latest record of an endpoint
is sure to survive: every event therefore carries the whole endpoint as it is after the
event (``endpoint``), and the fold takes the newest ``version`` it has seen. A re-read, a
duplicate or a record older than one already folded changes nothing, and a reader that
starts after compaction gets the same table as one that read every record.

Each endpoint also carries its circuit breaker (``Breaker``: closed, open, half-open with
one named probe delivery). Workers append its transitions here (``circuit_opened``,
``circuit_half_opened``, ``circuit_closed``, ``auto_disabled``) with the next version of
the endpoint they saw: the fold's "newest version wins" makes that a compare-and-set, so
when two workers decide at once the first record in the log wins and the other changes
nothing. The rule that decides when is streams/breaker_rule.py.

What the workers and the projection apply from an endpoint, and what wins: its pause and
disable, its circuit breaker, its webhook signing secrets and lookup URL, its rate limit,
its ``retry_policy`` and its ``slo_s``. For each, where the registry sets one, the
registry's wins over the environment fallback (``LEDGER_CHANNELS__*`` settings, and for
the SLO the request's ``slo_seconds``), and a change applies without a restart: the retry
policy at the worker's next decision for the endpoint's deliveries (streams/retry.py), the
SLO at the next ``ledger status``, dashboard or ``/metrics`` question, for deliveries
requested before the change too (projections/slo.py).

A record of this topic that is not an endpoint event, or is keyed other than by its
endpoint id, is refused by every reader (``decode_endpoint_record``): the registry's
followers skip and count it, the live projector dead-letters it once
(projections/deadletters.py).

Signing secrets are never in clear here: ``EndpointSecret.ciphertext`` is a Fernet token
(clients/endpoint_secrets.py encrypts and decrypts; this module loads no crypto library).
"""

from __future__ import annotations

import re
from datetime import datetime, timedelta
from typing import Annotated, ClassVar, Literal, Self

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    TypeAdapter,
    ValidationError,
    field_validator,
    model_validator,
)

from events.base import Event
from events.bounds import MAX_RECIPIENT_CHARS, MAX_SLO_SECONDS, MAX_TEXT_CHARS, Moment
from events.retry_policy import RetryPolicy

ENDPOINT_ID = re.compile(r"^[a-z0-9][a-z0-9._-]{0,99}$")
MAX_SECRETS = 8
FROZEN = ConfigDict(frozen=True, extra="forbid")


def check_endpoint_id(value: str) -> str:
    """An endpoint id: 1-100 lowercase letters, digits and ._- (it is the record key)."""
    if not ENDPOINT_ID.match(value):
        raise ValueError(
            "an endpoint id is 1-100 lowercase letters, digits and ._- starting with a "
            "letter or digit"
        )
    return value


class EndpointSpec(BaseModel):
    """What an endpoint is and what its owner declares about it."""

    model_config = FROZEN

    channel: str = Field(min_length=1, max_length=100)
    # webhook: a URL prefix (scheme, host, port, path on a segment boundary); the other
    # channels: the recipient exactly (a Slack channel, a mailbox, a browser target name).
    address: str = Field(min_length=1, max_length=MAX_RECIPIENT_CHARS)
    lookup_url: str | None = Field(default=None, max_length=MAX_RECIPIENT_CHARS)
    # Declared by the endpoint's owner, never assumed (ChannelSettings.webhook_endpoints).
    receiver_dedupes: bool = False
    settle_s: float | None = Field(default=None, ge=0, le=MAX_SLO_SECONDS)
    # A whole policy (the CLI fills the fields not given with the channel's defaults); wins
    # over LEDGER_CHANNELS__RETRY_POLICIES for this endpoint's deliveries (streams/retry.py).
    retry_policy: RetryPolicy | None = None
    # Applied by streams/ (streams/rate_limits.py), not by the registry.
    rate_limit_per_s: float | None = Field(default=None, gt=0, le=1_000_000)
    # Wins over the requests' slo_seconds for this endpoint's deliveries (projections/slo.py).
    slo_s: int | None = Field(default=None, ge=1, le=MAX_SLO_SECONDS)


class EndpointSecret(BaseModel):
    """One signing secret, encrypted (a Fernet token), and until when it signs."""

    model_config = FROZEN

    ciphertext: str = Field(min_length=1, max_length=MAX_TEXT_CHARS)
    added_at: Moment
    # Set while a newer secret takes over: after it this one no longer signs.
    expires_at: Moment | None = None

    def active(self, now: datetime) -> bool:
        """Whether this secret still signs at ``now``."""
        return self.expires_at is None or now < self.expires_at


class Stop(BaseModel):
    """Who paused or disabled an endpoint, why and when."""

    model_config = FROZEN

    by: str = Field(min_length=1, max_length=200)
    reason: str = Field(min_length=1, max_length=MAX_TEXT_CHARS)
    at: Moment


CircuitState = Literal["closed", "open", "half_open"]
BREAKER_ACTOR = "circuit-breaker"


class Breaker(BaseModel):
    """An endpoint's circuit breaker as the last transition left it."""

    model_config = FROZEN

    state: CircuitState
    since: Moment  # when this state began
    # When the outage began (the first opening; kept while it half-opens and reopens).
    outage_since: Moment | None = None
    # Half-open: the one delivery that may be sent (its idempotency key), and the worker
    # that named it (the only one that claims it).
    probe: str | None = Field(default=None, max_length=MAX_TEXT_CHARS)
    probe_worker: str | None = Field(default=None, max_length=MAX_TEXT_CHARS)
    # What the worker that opened it saw: failures among sends in its window.
    failures: int = Field(default=0, ge=0)
    sends: int = Field(default=0, ge=0)


class EndpointState(BaseModel):
    """One endpoint as the registry knows it after its latest event."""

    model_config = FROZEN

    endpoint_id: str
    version: int = Field(ge=1)
    spec: EndpointSpec
    secrets: tuple[EndpointSecret, ...] = Field(default=(), max_length=MAX_SECRETS)
    paused: Stop | None = None
    disabled: Stop | None = None
    registered_at: Moment
    updated_at: Moment
    breaker: Breaker | None = None  # None: closed, never tripped

    _id = field_validator("endpoint_id")(check_endpoint_id)

    @property
    def circuit(self) -> CircuitState:
        """The breaker's state: ``closed``, ``open`` or ``half_open``."""
        return "closed" if self.breaker is None else self.breaker.state

    @property
    def state(self) -> str:
        """``disabled``, ``paused`` or ``active`` (disabled wins: it holds longer)."""
        if self.disabled is not None:
            return "disabled"
        if self.paused is not None:
            return "paused"
        return "active"

    def active_secrets(self, now: datetime) -> tuple[EndpointSecret, ...]:
        """The secrets that sign at ``now`` (several during a rotation)."""
        return tuple(s for s in self.secrets if s.active(now))


class EndpointEvent(Event):
    """An event of one endpoint: what happened, by whom, and the endpoint after it."""

    endpoint_id: str
    endpoint: EndpointState
    actor: str = Field(min_length=1, max_length=200)

    _id = field_validator("endpoint_id")(check_endpoint_id)

    @model_validator(mode="after")
    def _its_own_endpoint(self) -> Self:
        if self.endpoint.endpoint_id != self.endpoint_id:
            raise ValueError("an endpoint event carries its own endpoint")
        return self


class EndpointRegistered(EndpointEvent):
    TYPE: ClassVar[str] = "endpoint.registered"
    type: Literal["endpoint.registered"] = "endpoint.registered"


class EndpointUpdated(EndpointEvent):
    TYPE: ClassVar[str] = "endpoint.updated"
    type: Literal["endpoint.updated"] = "endpoint.updated"
    # Names of the spec fields that changed (for the timeline; the state says the rest).
    changed: tuple[str, ...] = ()


class EndpointPaused(EndpointEvent):
    TYPE: ClassVar[str] = "endpoint.paused"
    type: Literal["endpoint.paused"] = "endpoint.paused"
    reason: str = Field(min_length=1, max_length=MAX_TEXT_CHARS)


class EndpointResumed(EndpointEvent):
    TYPE: ClassVar[str] = "endpoint.resumed"
    type: Literal["endpoint.resumed"] = "endpoint.resumed"


class EndpointDisabled(EndpointEvent):
    TYPE: ClassVar[str] = "endpoint.disabled"
    type: Literal["endpoint.disabled"] = "endpoint.disabled"
    reason: str = Field(min_length=1, max_length=MAX_TEXT_CHARS)


class EndpointEnabled(EndpointEvent):
    TYPE: ClassVar[str] = "endpoint.enabled"
    type: Literal["endpoint.enabled"] = "endpoint.enabled"


class EndpointSecretRotated(EndpointEvent):
    """A new secret signs from now on; the old ones until ``endpoint``'s expiry for them
    (``finished``: the rotation's end, the old ones dropped)."""

    TYPE: ClassVar[str] = "endpoint.secret_rotated"
    type: Literal["endpoint.secret_rotated"] = "endpoint.secret_rotated"
    finished: bool = False


class EndpointCircuitOpened(EndpointEvent):
    """A worker's window crossed the rule (or the half-open probe failed): deliveries wait
    as ``circuit_open``."""

    TYPE: ClassVar[str] = "endpoint.circuit_opened"
    type: Literal["endpoint.circuit_opened"] = "endpoint.circuit_opened"
    reason: str = Field(min_length=1, max_length=MAX_TEXT_CHARS)


class EndpointCircuitHalfOpened(EndpointEvent):
    """The open duration passed: one probe delivery (``endpoint.breaker.probe``) may go."""

    TYPE: ClassVar[str] = "endpoint.circuit_half_opened"
    type: Literal["endpoint.circuit_half_opened"] = "endpoint.circuit_half_opened"


class EndpointCircuitClosed(EndpointEvent):
    """The probe succeeded: the waiting deliveries go out, in request order."""

    TYPE: ClassVar[str] = "endpoint.circuit_closed"
    type: Literal["endpoint.circuit_closed"] = "endpoint.circuit_closed"


class EndpointAutoDisabled(EndpointDisabled):
    """The circuit stayed open longer than allowed: the endpoint is disabled (an operator
    enables it again); its deliveries keep waiting, as ``disabled``."""

    TYPE: ClassVar[str] = "endpoint.auto_disabled"
    type: Literal["endpoint.auto_disabled"] = "endpoint.auto_disabled"  # type: ignore[assignment]


AnyEndpointEvent = Annotated[
    EndpointRegistered
    | EndpointUpdated
    | EndpointPaused
    | EndpointResumed
    | EndpointDisabled
    | EndpointEnabled
    | EndpointSecretRotated
    | EndpointCircuitOpened
    | EndpointCircuitHalfOpened
    | EndpointCircuitClosed
    | EndpointAutoDisabled,
    Field(discriminator="type"),
]
ENDPOINT_EVENT: TypeAdapter[AnyEndpointEvent] = TypeAdapter(AnyEndpointEvent)


class EndpointDecodeError(ValueError):
    """A record of the endpoints topic that is not an endpoint event (one line)."""


def decode_endpoint_event(data: bytes | None) -> AnyEndpointEvent:
    """One record value of ``ledger.endpoints`` validated, or ``EndpointDecodeError``."""
    if data is None:
        raise EndpointDecodeError("a tombstone (no value)")
    try:
        return ENDPOINT_EVENT.validate_json(data)
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(p) for p in first["loc"])
        raise EndpointDecodeError(f"not an endpoint event: {where}: {first['msg']}") from None


def decode_endpoint_record(value: bytes | None, key: bytes | None) -> AnyEndpointEvent:
    """One record of ``ledger.endpoints`` (value and key) as every reader takes it, or
    ``EndpointDecodeError``: a record keyed other than by its endpoint id is refused too
    (compaction keeps one record per key, so a mis-keyed one could outlive its endpoint's
    newer versions). The registry's followers skip what this refuses; the projector
    dead-letters it (projections/deadletters.py)."""
    event = decode_endpoint_event(value)
    if key is not None and key != event.endpoint_id.encode("utf-8"):
        raise EndpointDecodeError("record key does not match the event's endpoint_id")
    return event


def fold(current: EndpointState | None, event: EndpointEvent) -> EndpointState:
    """The endpoint after ``event``: the newest version wins, so a duplicate, a re-read or
    an older record changes nothing (and a compacted topic folds to the same table)."""
    if current is not None and event.endpoint.version <= current.version:
        return current
    return event.endpoint


def fold_all(events: list[AnyEndpointEvent]) -> dict[str, EndpointState]:
    """Every endpoint after ``events`` (in any order of versions)."""
    table: dict[str, EndpointState] = {}
    for event in events:
        table[event.endpoint_id] = fold(table.get(event.endpoint_id), event)
    return table


# -- decisions: the next event from the current state and an operator's command (pure) --


class EndpointRefused(ValueError):
    """A command that does not apply to the endpoint as it is (one line, a hint)."""

    def __init__(self, message: str, hint: str) -> None:
        super().__init__(message)
        self.hint = hint


def _next(state: EndpointState, at: datetime, **changes: object) -> EndpointState:
    data = {**state.model_dump(), **changes, "version": state.version + 1, "updated_at": at}
    return EndpointState.model_validate(data)


def register(
    endpoint_id: str,
    spec: EndpointSpec,
    secrets: tuple[EndpointSecret, ...],
    *,
    actor: str,
    producer: str,
    at: datetime,
    existing: EndpointState | None,
) -> EndpointRegistered:
    """A new endpoint (refused if the id is taken)."""
    if existing is not None:
        raise EndpointRefused(
            f"endpoint {endpoint_id!r} exists already",
            f"change it with 'ledger endpoints update {endpoint_id}'",
        )
    state = EndpointState(
        endpoint_id=endpoint_id,
        version=1,
        spec=spec,
        secrets=secrets,
        registered_at=at,
        updated_at=at,
    )
    return EndpointRegistered(
        endpoint_id=endpoint_id, endpoint=state, actor=actor, producer=producer, occurred_at=at
    )


def update(
    state: EndpointState, spec: EndpointSpec, *, actor: str, producer: str, at: datetime
) -> EndpointUpdated:
    """The endpoint with ``spec`` (its channel stays)."""
    if spec.channel != state.spec.channel:
        raise EndpointRefused(
            f"endpoint {state.endpoint_id!r} is a {state.spec.channel} endpoint",
            "an endpoint keeps its channel: add a new endpoint for another channel",
        )
    changed = tuple(
        name
        for name in EndpointSpec.model_fields
        if getattr(spec, name) != getattr(state.spec, name)
    )
    return EndpointUpdated(
        endpoint_id=state.endpoint_id,
        endpoint=_next(state, at, spec=spec.model_dump()),
        actor=actor,
        producer=producer,
        occurred_at=at,
        changed=changed,
    )


def pause(
    state: EndpointState, reason: str, *, actor: str, producer: str, at: datetime
) -> EndpointPaused:
    """Deliveries to the endpoint wait (PENDING, ``paused``) until it is resumed."""
    if state.paused is not None:
        raise EndpointRefused(
            f"endpoint {state.endpoint_id!r} is paused already (by {state.paused.by})",
            f"resume it with 'ledger endpoints resume {state.endpoint_id}'",
        )
    stop = Stop(by=actor, reason=reason, at=at)
    return EndpointPaused(
        endpoint_id=state.endpoint_id,
        endpoint=_next(state, at, paused=stop.model_dump()),
        actor=actor,
        producer=producer,
        occurred_at=at,
        reason=reason,
    )


def resume(state: EndpointState, *, actor: str, producer: str, at: datetime) -> EndpointResumed:
    """The paused endpoint's deliveries go out again, in request order."""
    if state.paused is None:
        raise EndpointRefused(
            f"endpoint {state.endpoint_id!r} is not paused",
            "'ledger endpoints show' says its state",
        )
    return EndpointResumed(
        endpoint_id=state.endpoint_id,
        endpoint=_next(state, at, paused=None),
        actor=actor,
        producer=producer,
        occurred_at=at,
    )


def disable(
    state: EndpointState, reason: str, *, actor: str, producer: str, at: datetime
) -> EndpointDisabled:
    """Deliveries to the endpoint wait (PENDING, ``disabled``) until it is enabled."""
    if state.disabled is not None:
        raise EndpointRefused(
            f"endpoint {state.endpoint_id!r} is disabled already (by {state.disabled.by})",
            f"enable it with 'ledger endpoints enable {state.endpoint_id}'",
        )
    stop = Stop(by=actor, reason=reason, at=at)
    return EndpointDisabled(
        endpoint_id=state.endpoint_id,
        endpoint=_next(state, at, disabled=stop.model_dump()),
        actor=actor,
        producer=producer,
        occurred_at=at,
        reason=reason,
    )


def enable(state: EndpointState, *, actor: str, producer: str, at: datetime) -> EndpointEnabled:
    """The disabled endpoint's deliveries go out again, in request order."""
    if state.disabled is None:
        raise EndpointRefused(
            f"endpoint {state.endpoint_id!r} is not disabled",
            "'ledger endpoints show' says its state",
        )
    return EndpointEnabled(
        endpoint_id=state.endpoint_id,
        endpoint=_next(state, at, disabled=None),
        actor=actor,
        producer=producer,
        occurred_at=at,
    )


def rotate_secret(
    state: EndpointState,
    new: EndpointSecret,
    overlap: timedelta,
    *,
    actor: str,
    producer: str,
    at: datetime,
) -> EndpointSecretRotated:
    """``new`` signs from now on; the secrets active now keep signing for ``overlap``, so
    a receiver that knows either accepts every request meanwhile."""
    if len(state.active_secrets(at)) + 1 > MAX_SECRETS:
        raise EndpointRefused(
            f"endpoint {state.endpoint_id!r} has {MAX_SECRETS - 1} active secrets already",
            f"finish the rotation first: 'ledger endpoints rotate-secret {state.endpoint_id} "
            "--finish'",
        )
    until = at + overlap
    kept = [
        s.model_copy(update={"expires_at": min(s.expires_at or until, until)})
        for s in state.active_secrets(at)
    ]
    return EndpointSecretRotated(
        endpoint_id=state.endpoint_id,
        endpoint=_next(state, at, secrets=[*(s.model_dump() for s in kept), new.model_dump()]),
        actor=actor,
        producer=producer,
        occurred_at=at,
    )


def finish_rotation(
    state: EndpointState, *, actor: str, producer: str, at: datetime
) -> EndpointSecretRotated:
    """Only the newest secret signs from now on."""
    if len(state.secrets) < 2:
        raise EndpointRefused(
            f"endpoint {state.endpoint_id!r} has no rotation under way",
            f"start one with 'ledger endpoints rotate-secret {state.endpoint_id}'",
        )
    newest = state.secrets[-1]
    return EndpointSecretRotated(
        endpoint_id=state.endpoint_id,
        endpoint=_next(state, at, secrets=[newest.model_dump()]),
        actor=actor,
        producer=producer,
        occurred_at=at,
        finished=True,
    )


def reencrypt(
    state: EndpointState,
    secrets: tuple[EndpointSecret, ...],
    *,
    actor: str,
    producer: str,
    at: datetime,
) -> EndpointUpdated:
    """The same secrets under a new encryption key (``secrets`` in the same order)."""
    return EndpointUpdated(
        endpoint_id=state.endpoint_id,
        endpoint=_next(state, at, secrets=[s.model_dump() for s in secrets]),
        actor=actor,
        producer=producer,
        occurred_at=at,
        changed=("secrets",),
    )


# -- the circuit breaker's transitions (pure; the worker decides when: breaker_rule.py) --


def _breaker(state: EndpointState, at: datetime, breaker: Breaker) -> EndpointState:
    return _next(state, at, breaker=breaker.model_dump())


def open_circuit(
    state: EndpointState,
    *,
    failures: int,
    sends: int,
    reason: str,
    producer: str,
    at: datetime,
) -> EndpointCircuitOpened:
    """Open the circuit of a closed or half-open endpoint (a duplicate is refused)."""
    if state.circuit == "open":
        raise EndpointRefused(f"endpoint {state.endpoint_id!r}: circuit open already", "none")
    outage = state.breaker.outage_since if state.breaker is not None else None
    return EndpointCircuitOpened(
        endpoint_id=state.endpoint_id,
        endpoint=_breaker(
            state,
            at,
            Breaker(
                state="open",
                since=at,
                outage_since=outage or at,
                failures=failures,
                sends=sends,
            ),
        ),
        actor=BREAKER_ACTOR,
        producer=producer,
        occurred_at=at,
        reason=reason,
    )


def half_open_circuit(
    state: EndpointState, *, probe: str, worker: str, producer: str, at: datetime
) -> EndpointCircuitHalfOpened:
    """Let one probe delivery (``probe``, claimed by ``worker`` only) through an open (or
    a stale half-open) circuit."""
    if state.breaker is None or state.breaker.state == "closed":
        raise EndpointRefused(f"endpoint {state.endpoint_id!r}: circuit closed", "none")
    return EndpointCircuitHalfOpened(
        endpoint_id=state.endpoint_id,
        endpoint=_breaker(
            state,
            at,
            Breaker(
                state="half_open",
                since=at,
                outage_since=state.breaker.outage_since,
                probe=probe,
                probe_worker=worker,
            ),
        ),
        actor=BREAKER_ACTOR,
        producer=producer,
        occurred_at=at,
    )


def close_circuit(
    state: EndpointState, *, probe: str, producer: str, at: datetime
) -> EndpointCircuitClosed:
    """Close a half-open circuit after its probe ``probe`` succeeded."""
    if state.breaker is None or state.breaker.state != "half_open" or state.breaker.probe != probe:
        raise EndpointRefused(f"endpoint {state.endpoint_id!r}: {probe} is not its probe", "none")
    return EndpointCircuitClosed(
        endpoint_id=state.endpoint_id,
        endpoint=_breaker(state, at, Breaker(state="closed", since=at)),
        actor=BREAKER_ACTOR,
        producer=producer,
        occurred_at=at,
    )


def auto_disable(
    state: EndpointState, *, reason: str, producer: str, at: datetime
) -> EndpointAutoDisabled:
    """Disable an endpoint whose circuit stayed open too long; its breaker starts closed
    again when an operator enables it."""
    if state.breaker is None or state.breaker.state == "closed" or state.disabled is not None:
        raise EndpointRefused(f"endpoint {state.endpoint_id!r}: nothing to disable", "none")
    stop = Stop(by=BREAKER_ACTOR, reason=reason, at=at)
    endpoint = _next(
        state,
        at,
        disabled=stop.model_dump(),
        breaker=Breaker(state="closed", since=at).model_dump(),
    )
    return EndpointAutoDisabled(
        endpoint_id=state.endpoint_id,
        endpoint=endpoint,
        actor=BREAKER_ACTOR,
        producer=producer,
        occurred_at=at,
        reason=reason,
    )
