"""Hostile text in events, rendered by a real Chromium: shown as text, never executed.

Anyone who can write to a topic chooses recipients, provider ids, agent names, errors
and worker ids; a link can carry any run id or search. The events go through the broker
and the projector like any others; every page that shows them is opened, and the
payloads' markers (a global, a dialog, a CSP report, an injected element) must stay absent.
"""

from __future__ import annotations

from urllib.parse import quote

from playwright.async_api import Browser, ConsoleMessage, Dialog, Page, expect

from events import (
    DeliveryClaimed,
    DeliverySent,
    DeliveryUnknown,
    RunFailed,
    RunStarted,
)
from events.delivery import DeliveryRequested, new_delivery_requested
from events.model import AnyDeliveryEvent, AnyExecutionEvent
from tests.dashboard.conftest import Stack
from tests.projections.scenarios import P, at

SCRIPT = "<script>window.__xss='script'</script>"
IMG = "\"><img src=x onerror=\"window.__xss='img';alert('img')\">"
SVG = "<svg onload=alert('svg')>"
JS = "javascript:window.__xss='javascript';alert('js')"
# Recipients must be http(s) URLs without blanks; the markup goes into path and query.
R_IMG = "http://127.0.0.1:9/x/\"><img/src=x/onerror=window.__xss='recipient'>"
R_SCRIPT = "http://127.0.0.1:9/<script>window.__xss='r2'</script>/javascript:alert('r2')"
R_JS = "http://127.0.0.1:9/y?next=javascript:alert('r3')"
PAYLOAD = {"html": SCRIPT, "img": IMG, "link": JS}
RUN = "run-hostile"
HOSTILE_RUN_ID = "<img src=x onerror=\"window.__xss='run-id';alert('run-id')\">"
# Anything a successful injection would leave in the document.
INJECTED = (
    "img, script:not([src]), iframe, object, embed, [onerror], [onload], [onclick], "
    "a[href^='javascript:' i]"
)
# Recorded before any page script runs.
WATCH = """
window.__csp = [];
document.addEventListener("securitypolicyviolation",
  (e) => window.__csp.push(e.violatedDirective + " " + e.blockedURI));
"""


def request(recipient: str, n: int) -> DeliveryRequested:
    return new_delivery_requested(
        run_id=RUN,
        event_type="run.failed",
        channel="webhook",
        recipient=recipient,
        payload=PAYLOAD,
        slo_seconds=60,
        producer=P,
        occurred_at=at(300 + n),
    )


def hostile_log() -> tuple[list[AnyExecutionEvent | AnyDeliveryEvent], list[DeliveryRequested]]:
    """A failed run with hostile agent and error, and three deliveries on the overview:
    UNKNOWN (hostile recipient and worker id), SENT past its SLO (hostile provider id),
    PENDING past its SLO."""
    unknown, sent, pending = request(R_IMG, 1), request(R_SCRIPT, 2), request(R_JS, 3)

    def common(req: DeliveryRequested) -> dict[str, str]:
        return {"idempotency_key": req.idempotency_key, "run_id": RUN, "producer": P}

    def claimed(req: DeliveryRequested) -> DeliveryClaimed:
        return DeliveryClaimed(
            **common(req),
            attempt=1,
            worker_id=SVG,
            fencing_token=1,
            lease_expires_at=at(400),
            occurred_at=at(310),
        )

    events: list[AnyExecutionEvent | AnyDeliveryEvent] = [
        RunStarted(run_id=RUN, agent=SCRIPT, producer=P, occurred_at=at(299)),
        RunFailed(run_id=RUN, error=IMG, producer=P, occurred_at=at(305)),
        unknown,
        sent,
        pending,
        claimed(unknown),
        DeliveryUnknown(
            **common(unknown),
            attempt=1,
            fencing_token=1,
            error_class="reset_after_write",
            reason=IMG,
            occurred_at=at(311),
        ),
        claimed(sent),
        DeliverySent(
            **common(sent),
            attempt=1,
            fencing_token=1,
            worker_id=SVG,
            provider_message_id=JS,
            provider_status=SCRIPT,
            http_status=202,
            occurred_at=at(312),
        ),
    ]
    return events, [unknown, sent, pending]


class Watched:
    """A page with everything a payload could trigger recorded."""

    def __init__(self, page: Page) -> None:
        self.page = page
        self.dialogs: list[str] = []
        self.errors: list[str] = []
        page.on("dialog", self._dialog)
        page.on("console", self._console)
        page.on("pageerror", lambda exc: self.errors.append(f"pageerror: {exc}"))

    async def _dialog(self, dialog: Dialog) -> None:
        self.dialogs.append(dialog.message)
        await dialog.dismiss()

    def _console(self, message: ConsoleMessage) -> None:
        # The 404 of a run that is not in the projection is the API answering, not a script.
        if message.type == "error" and "status of 404" not in message.text:
            self.errors.append(message.text)

    async def assert_inert(self, where: str) -> None:
        page = self.page
        assert await page.evaluate("window.__xss === undefined"), where
        assert await page.evaluate("window.__csp") == [], where
        assert await page.locator(INJECTED).count() == 0, where
        assert self.dialogs == [], where
        assert self.errors == [], where


async def test_hostile_text_is_shown_as_text_and_never_runs(stack: Stack, browser: Browser) -> None:
    events, (unknown, sent, pending) = hostile_log()
    await stack.append(events)
    page = await browser.new_page(viewport={"width": 1300, "height": 1000})
    await page.add_init_script(WATCH)
    page.set_default_timeout(15_000)
    watched = Watched(page)

    await page.goto(stack.url)
    await expect(page.locator("#table-unknown tbody tr")).to_have_count(2)  # run-a's and ours
    await watched.assert_inert("overview")
    await expect(page.locator("#table-unknown")).to_contain_text(R_IMG)
    await expect(page.locator("#table-overdue-sent")).to_contain_text(JS)
    await expect(page.locator("#table-overdue-sent")).to_contain_text(R_SCRIPT)
    await expect(page.locator("#table-overdue")).to_contain_text(R_JS)
    await expect(page.locator(f"#table-unknown a.run-link:text-is('{RUN}')")).to_have_count(1)
    await watched.assert_inert("overview")

    await page.goto(f"{stack.url}runs/{RUN}?key={unknown.idempotency_key}")
    left = page.locator("#answer-left li")
    await expect(left).to_have_count(3)
    await expect(page.locator("#timeline li").first).to_be_visible()
    await watched.assert_inert("run page")
    for recipient in (R_IMG, R_SCRIPT, R_JS):
        await expect(left.filter(has_text=recipient)).to_have_count(1)
    await expect(page.locator("#answer-keys")).to_contain_text(f"provider message id {JS}")
    timeline = page.locator("#timeline")
    await expect(timeline).to_contain_text(f"run started by {SCRIPT}")
    await expect(timeline).to_contain_text(f"run failed: {IMG}")
    await expect(timeline).to_contain_text(f"attempt 1 claimed by {SVG}")
    await expect(timeline).to_contain_text(f"provider message id {JS}")
    await watched.assert_inert("run page")

    await page.fill("#search", unknown.idempotency_key)
    await page.press("#search", "Enter")
    await expect(page.locator("#search-list li")).to_contain_text(R_IMG)
    await page.fill("#search", IMG)
    await page.press("#search", "Enter")
    await expect(page.locator("#search-results h2")).to_have_text(f"0 match(es) for “{IMG}”")
    await watched.assert_inert("search")

    # A link an attacker sends: the run id comes from the address bar.
    await page.goto(f"{stack.url}runs/{quote(HOSTILE_RUN_ID, safe='')}")
    await expect(page.locator("#error")).to_contain_text(
        f"run {HOSTILE_RUN_ID} is not in the projection"
    )
    await watched.assert_inert("hostile run id")
    assert sent.payload == PAYLOAD
    assert pending.recipient == R_JS
    await page.close()
