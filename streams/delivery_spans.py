"""The worker's spans for one delivery: claim, send, lookup, confirm (tracing on only).

Their parent is the trace context the request arrived with (``DeliveryState.traceparent``,
from the ``DeliveryRequested`` record's header), except the send, whose parent is the
claim's span when this process made the claim (it knows it from the claim to the send:
``ClaimSpans``). The send's HTTP request is a client span below it (traced_transport.py),
and the receiver continues from there. Each carries the idempotency key and the fencing
token of the attempt (README, Tracing).
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any

from opentelemetry import trace

from clients.tracing import KEY_ATTRIBUTE, TOKEN_ATTRIBUTE, traceparent_of, tracer
from clients.tracing import context_of as parent_context
from events.base import Event
from events.delivery import DeliveryClaimed
from events.delivery_state import DeliveryState

# Claims whose send has not begun, remembered for their send's parent; past this many
# (claims lost, a backlog) the memory is dropped: those sends take the request's context.
MAX_REMEMBERED = 100_000


def attempt_attributes(state: DeliveryState) -> dict[str, Any]:
    """What every span of an attempt carries."""
    return {
        KEY_ATTRIBUTE: state.idempotency_key,
        TOKEN_ATTRIBUTE: state.fencing_token,
        "ledger.attempt": state.attempt,
        "ledger.channel": state.channel,
        "ledger.run_id": state.run_id,
    }


def outcome_attributes(
    outcome: str, error_class: str | None = None, http_status: int | None = None
) -> None:
    """Record a send's or a lookup's outcome on the current span."""
    current = trace.get_current_span()
    current.set_attribute("ledger.outcome", str(outcome))
    if error_class is not None:
        current.set_attribute("ledger.error_class", str(error_class))
    if http_status is not None:
        current.set_attribute("http.response.status_code", http_status)


class ClaimSpans:
    """The claims this process appended, as spans, and each claim's span until its send."""

    def __init__(self) -> None:
        self._parents: dict[str, str] = {}

    @contextmanager
    def claiming(self, claims: Sequence[tuple[DeliveryState, Event]]) -> Iterator[None]:
        """A ``ledger.claim`` span per claim, around the append that writes them all."""
        spans = []
        for state, event in claims:
            if not isinstance(event, DeliveryClaimed):
                continue
            attributes = attempt_attributes(state)
            attributes.update(
                {
                    TOKEN_ATTRIBUTE: event.fencing_token,
                    "ledger.attempt": event.attempt,
                    "ledger.lease_expires_at": event.lease_expires_at.isoformat(),
                }
            )
            opened = tracer().start_span(
                "ledger.claim", context=parent_context(state.traceparent), attributes=attributes
            )
            spans.append((state.idempotency_key, opened))
        # Remembered before the append: a claim can be read back (and its send begun) while
        # a timer's append is still waiting for its acknowledgement.
        if len(self._parents) + len(spans) > MAX_REMEMBERED:
            self._parents.clear()
        for key, opened in spans:
            if (parent := traceparent_of(opened)) is not None:
                self._parents[key] = parent
        try:
            yield
        except BaseException as exc:
            for key, opened in spans:
                self._parents.pop(key, None)
                opened.record_exception(exc)
                opened.set_status(trace.StatusCode.ERROR, type(exc).__name__)
            raise
        finally:
            for _key, opened in spans:
                opened.end()

    def parent_of_send(self, key: str) -> str | None:
        """The span of this process's claim of ``key``, once (then forgotten)."""
        return self._parents.pop(key, None)

    def forget(self) -> None:
        """Drop what is remembered (partitions revoked)."""
        self._parents.clear()
