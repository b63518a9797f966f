"""Retry-After parsing: delay-seconds, HTTP dates relative to now, nonsense ignored; the
lookup contract's ``stuck``."""

from email.utils import formatdate

import httpx

from events.outcomes import LookupOutcome
from streams.channels.outcomes import lookup_request, retry_after_seconds

NOW = 1_700_000_000.0


def test_retry_after_forms() -> None:
    assert retry_after_seconds("120", lambda: NOW) == 120.0
    assert retry_after_seconds(formatdate(NOW + 30, usegmt=True), lambda: NOW) == 30.0
    assert retry_after_seconds(formatdate(NOW - 30, usegmt=True), lambda: NOW) == 0.0
    assert retry_after_seconds("-5", lambda: NOW) is None
    assert retry_after_seconds("soon", lambda: NOW) is None
    assert retry_after_seconds(None) is None


async def test_a_lookup_answered_stuck_is_stuck_whatever_the_success_status() -> None:
    """The kit answers ``stuck`` with 409; a receiver that says it with 200 or 202 means
    the same: never found, never still processing."""

    def answer(request: httpx.Request) -> httpx.Response:
        code = int(request.url.params["code"])
        return httpx.Response(code, json={"status": request.url.params["status"]})

    async with httpx.AsyncClient(transport=httpx.MockTransport(answer)) as client:
        outcomes = {
            (code, status): (
                await lookup_request(
                    client,
                    "http://127.0.0.1:9/lookup/k",
                    {},
                    {"code": str(code), "status": status},
                    deadline_s=5,
                )
            ).outcome
            for code, status in [(409, "stuck"), (200, "stuck"), (202, "stuck"), (409, "x")]
        }
    assert outcomes == {
        (409, "stuck"): LookupOutcome.STUCK,
        (200, "stuck"): LookupOutcome.STUCK,
        (202, "stuck"): LookupOutcome.STUCK,
        (409, "x"): LookupOutcome.LOOKUP_ERROR,
    }
