"""Credentials in URLs that are already in the log are shown nowhere.

The SDK refuses such recipients now; these events come from a raw producer (or from
before the check), so the log keeps them. Every place that shows them must not.
"""

from __future__ import annotations

import json
import subprocess
import sys

import httpx

from config.settings import Settings
from events import DeliveryClaimed, DeliveryFailed, DeliveryUnknown
from events.delivery import new_delivery_requested
from events.model import AnyDeliveryEvent
from events.outcomes import ErrorClass
from events.redaction import redacted_text
from ledger.stack import settings_env
from tests.dashboard.conftest import Stack
from tests.projections.scenarios import P, at

SECRETS = ("s3cr3t", "K123", "T0K3N", "CS99", "F4AG", "admin:")
LEAKY = (
    "http://admin:s3cr3t@127.0.0.1:9/hooks/leaky"
    "?api_key=K123&access_token=T0K3N&client_secret=CS99&page=2#token=F4AG"
)
SHOWN = "http://127.0.0.1:9/hooks/leaky?api_key=REDACTED&access_token=REDACTED"


def leaky_run() -> list[AnyDeliveryEvent]:
    """Two requests with credentials in their recipients: one UNKNOWN (on the overview),
    one FAILED with a reason that quotes the URL (as old evidence did)."""
    events: list[AnyDeliveryEvent] = []
    for n, (hook, error) in enumerate(
        [("leaky", ErrorClass.TIMEOUT_AFTER_WRITE), ("leaky2", None)]
    ):
        recipient = LEAKY.replace("/hooks/leaky?", f"/hooks/{hook}?")
        request = new_delivery_requested(
            run_id="run-leaky",
            event_type="run.succeeded",
            channel="webhook",
            recipient=recipient,
            payload={"n": n},
            slo_seconds=60,
            producer=P,
            occurred_at=at(10 + n),
        )
        common = {"idempotency_key": request.idempotency_key, "run_id": "run-leaky", "producer": P}
        claimed = DeliveryClaimed(
            **common,
            attempt=1,
            fencing_token=1,
            worker_id="w1",
            lease_expires_at=at(60),
            occurred_at=at(12 + n),
        )
        outcome: DeliveryUnknown | DeliveryFailed
        if error is not None:
            outcome = DeliveryUnknown(
                **common,
                attempt=1,
                fencing_token=1,
                error_class=error,
                reason=f"no answer from {recipient}",
                occurred_at=at(14 + n),
            )
        else:
            outcome = DeliveryFailed(
                **common,
                attempts=1,
                error_class=ErrorClass.HTTP_4XX,
                reason=f"POST {recipient} answered 403",
                occurred_at=at(14 + n),
            )
        events += [request, claimed, outcome]
    return events


def wide(settings: Settings, *args: str) -> subprocess.CompletedProcess[str]:
    """``ledger ARGS`` on a terminal wide enough that no table folds a URL (a secret cut
    in two would hide from the check)."""
    return subprocess.run(
        [sys.executable, "-m", "ledger", *args],
        env={**settings_env(settings), "COLUMNS": "1000"},
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def assert_redacted(where: str, text: str) -> None:
    for secret in SECRETS:
        assert secret not in text, f"{where} shows {secret!r}"
    assert SHOWN in text, f"{where} does not show the recipient (redacted): {text[:2000]}"


def test_a_url_loses_userinfo_and_secret_looking_values_only() -> None:
    assert redacted_text(f"webhook {LEAKY}: FAILED") == (
        f"webhook {SHOWN}&client_secret=REDACTED&page=2#token=REDACTED: FAILED"
    )
    assert redacted_text("http://h.test/x?monkey=1&key=2&X-Amz-Signature=3") == (
        "http://h.test/x?monkey=1&key=REDACTED&X-Amz-Signature=REDACTED"
    )
    # urlsplit refuses this one; it must still come out without its secrets.
    assert redacted_text("http://u:pw@[::1/x?password=pw") == "http://[::1/x?password=REDACTED"
    assert redacted_text("no url here: a@b?token=x") == "no url here: a@b?token=x"


async def test_no_output_shows_credentials_from_the_log(stack: Stack) -> None:
    events = leaky_run()
    await stack.append(events)
    key = events[0].idempotency_key

    async with httpx.AsyncClient(base_url=stack.url, timeout=10) as http:
        for path in ("/api/runs/run-leaky", "/api/overview", f"/api/search?q={key}"):
            answer = await http.get(path)
            assert answer.status_code == 200, path
            assert_redacted(path, answer.text)
        metrics = await http.get("/metrics")
    for secret in SECRETS:
        assert secret not in metrics.text

    dsn = ("--dsn", stack.dsn)
    for args in (
        ("run", "run-leaky"),
        ("run", "run-leaky", "--timeline"),
        ("run", "run-leaky", "--json"),
        ("status",),
        ("status", "--json"),
        ("replay",),
        ("replay", "--format", "table"),
    ):
        done = wide(stack.settings, *args, *(dsn if args[0] != "replay" else ()))
        assert done.returncode in (0, 1), (args, done.stderr)  # status: 1 = needs attention
        assert_redacted(" ".join(args), done.stdout)
        assert "Traceback" not in done.stderr

    # The log itself is immutable: an export still holds the event as it was written.
    export = wide(stack.settings, "replay", "--format", "jsonl", "--run-id", "run-leaky")
    recipients = sorted(
        line["event"]["recipient"]
        for line in map(json.loads, export.stdout.splitlines())
        if line.get("event", {}).get("type") == "delivery.requested"
    )
    assert recipients == sorted([LEAKY, LEAKY.replace("/hooks/leaky?", "/hooks/leaky2?")])
