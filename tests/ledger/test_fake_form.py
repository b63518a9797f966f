"""The fake form's search page and login switch, and ``ledger fake-form --login-required``."""

from __future__ import annotations

import re

import httpx

from tests.fixtures.broker import TEST_BROKER_PORT
from tests.fixtures.fake_cli import fake_server, interrupt
from tests.fixtures.form import BackgroundFakeForm

# Outside the ephemeral range, beside this run's broker ports.
CLI_PORT = TEST_BROKER_PORT + 13


def submit(base: str, key: str, title: str = "disk full") -> httpx.Response:
    fields = {"title": title, "body": "b", "idempotency_key": key, "fencing_token": "1"}
    return httpx.post(f"{base}/submit", data=fields)


def test_the_search_page_lists_matching_submissions_or_says_no_results(
    fake_form: BackgroundFakeForm,
) -> None:
    base = fake_form.app.url
    for key in ("abc-1", "abc-1", "xyz-2"):  # no dedupe: abc-1 twice
        assert submit(base, key).status_code == 200
    page = httpx.get(f"{base}/search", params={"q": "abc-1"}).text
    results = re.findall(r'<li class="result" data-id="([^"]+)" data-key="([^"]+)"', page)
    assert results == [("T-1", "abc-1"), ("T-2", "abc-1")]
    # A fuzzy search: a substring finds other keys' submissions (what key_attribute is for).
    fuzzy = httpx.get(f"{base}/search", params={"q": "abc"}).text
    assert fuzzy.count('class="result"') == 2
    missing = httpx.get(f"{base}/search", params={"q": "nope"}).text
    assert 'id="no-results"' in missing
    assert 'class="result"' not in missing
    box = httpx.get(f"{base}/search").text
    assert 'id="q"' in box
    assert 'id="no-results"' not in box


def test_the_login_switch_redirects_the_form_and_accepts_nothing(
    fake_form: BackgroundFakeForm,
) -> None:
    base = fake_form.app.url
    switched = httpx.post(f"{base}/switches", json={"login_required": True})
    assert switched.json() == {"login_required": True}
    form = httpx.get(f"{base}/form")
    assert (form.status_code, form.headers["location"]) == (302, "/login?next=/form")
    login = httpx.get(f"{base}/form", follow_redirects=True)
    assert 'form id="login"' in login.text
    assert submit(base, "k1").status_code == 302
    assert fake_form.app.accepted() == []
    bad = httpx.post(f"{base}/switches", json={"login_required": "maybe"})
    assert bad.status_code == 400
    assert httpx.post(f"{base}/switches", json={"login_required": False}).status_code == 200
    assert httpx.get(f"{base}/form").status_code == 200
    assert submit(base, "k1").status_code == 200
    assert [s.key for s in fake_form.app.accepted()] == ["k1"]


def test_ledger_fake_form_login_required() -> None:
    with fake_server("fake-form", "--port", str(CLI_PORT), "--login-required") as (process, urls):
        assert urls["search"].endswith("/search")
        assert httpx.get(urls["form"]).status_code == 302
        assert "fake form stopped" in interrupt(process)
