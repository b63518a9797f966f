"""The fake email API: its answers' shapes, its dedupe window, and ``ledger fake-email-api``."""

from __future__ import annotations

import json
import time

import httpx

from tests.fixtures.email_api import API_KEY, SENDER, BackgroundFakeEmailApi, FakeEmailApiFactory
from tests.fixtures.fake_cli import fake_server, interrupt

AUTH = {"authorization": f"Bearer {API_KEY}"}
MESSAGE = {"from": SENDER, "to": "ops@example.com", "subject": "Hi", "text": "Ready."}


def test_errors_are_status_code_name_message(fake_email_api: BackgroundFakeEmailApi) -> None:
    url = f"{fake_email_api.api_url}/emails"
    missing = httpx.post(url, json=MESSAGE)
    assert (missing.status_code, missing.json()["name"]) == (401, "missing_api_key")
    wrong = httpx.post(url, json=MESSAGE, headers={"authorization": "Bearer nope"})
    assert (wrong.status_code, wrong.json()["name"]) == (403, "invalid_api_key")
    invalid = httpx.post(url, json={**MESSAGE, "subject": ""}, headers=AUTH)
    assert invalid.status_code == 422
    assert invalid.json() == {
        "statusCode": 422,
        "name": "validation_error",
        "message": "`subject` is required",
    }
    assert httpx.get(f"{url}/em_nope", headers=AUTH).status_code == 404
    assert fake_email_api.fake.messages() == []


def test_dedupe_honours_the_key_for_its_window_only(
    fake_email_api_factory: FakeEmailApiFactory,
) -> None:
    fake = fake_email_api_factory(dedupe=True, dedupe_window_s=0.5)
    url = f"{fake.api_url}/emails"
    headers = {**AUTH, "idempotency-key": "k1"}
    first = httpx.post(url, json=MESSAGE, headers=headers).json()["id"]
    assert httpx.post(url, json=MESSAGE, headers=headers).json()["id"] == first
    other = httpx.post(url, json={**MESSAGE, "text": "Other."}, headers=headers)
    assert (other.status_code, other.json()["name"]) == (409, "invalid_idempotent_request")
    time.sleep(0.6)  # past the window the key is forgotten: a second email
    assert httpx.post(url, json=MESSAGE, headers=headers).json()["id"] != first
    assert len(fake.fake.messages("k1")) == 2


def test_ledger_fake_email_api_serves_until_interrupted() -> None:
    settings = {"api_url": "http://127.0.0.1:1", "api_key": API_KEY, "from_address": SENDER}
    channels = {"LEDGER_CHANNELS__SETTINGS": json.dumps({"email_api": settings})}
    with fake_server("fake-email-api", "--port", "0", "--dedupe", env=channels) as (process, urls):
        api = urls["api"]
        headers = {**AUTH, "idempotency-key": "k2"}
        sent = httpx.post(f"{api}/emails", json=MESSAGE, headers=headers).json()["id"]
        again = httpx.post(f"{api}/emails", json=MESSAGE, headers=headers).json()["id"]
        assert sent == again
        shown = httpx.get(f"{api}/emails", params={"idempotency_key": "k2"}, headers=AUTH)
        assert shown.json()["id"] == sent
        assert "fake email API stopped" in interrupt(process)
