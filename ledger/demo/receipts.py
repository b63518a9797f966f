"""What each fake receiver got, per idempotency key, read as a user would read it: the
Slack conversation's history, the email API's lookup, the relay's Maildir, the form's
list of accepted entries. None of them dedupes, so a count above 1 is a second delivery."""

from __future__ import annotations

import email.parser
from collections import Counter
from pathlib import Path

import httpx

from ledger.demo.options import DEMO_EMAIL_API_KEY, DEMO_SLACK_CHANNEL, DEMO_SLACK_TOKEN


def forms_per_key(accepted_url: str, keys: list[str]) -> Counter[str]:
    """Submissions the fake form accepted per idempotency key (its list by key: it does
    not dedupe, so a second submit is a second entry)."""
    found: Counter[str] = Counter()
    with httpx.Client(timeout=30) as client:
        for key in keys:
            listed = client.get(accepted_url, params={"key": key}).json()["accepted"]
            if listed:
                found[key] = len(listed)
    return found


def slack_messages_per_key(api: str) -> Counter[str]:
    """Messages per idempotency key in the demo's conversation, read as a user would:
    conversations.history with metadata, every page (bounded)."""
    found: Counter[str] = Counter()
    cursor = ""
    with httpx.Client(
        base_url=api, headers={"Authorization": f"Bearer {DEMO_SLACK_TOKEN.get_secret_value()}"}
    ) as client:
        for _ in range(1000):
            answer = client.post(
                "conversations.history",
                data={
                    "channel": DEMO_SLACK_CHANNEL,
                    "include_all_metadata": "true",
                    "limit": "200",
                    "cursor": cursor,
                },
                timeout=30,
            ).json()
            for message in answer.get("messages", []):
                payload = (message.get("metadata") or {}).get("event_payload") or {}
                if isinstance(payload.get("idempotency_key"), str):
                    found[payload["idempotency_key"]] += 1
            cursor = (answer.get("response_metadata") or {}).get("next_cursor") or ""
            if not answer.get("has_more") or not cursor:
                break
    return found


def mails_per_key(maildir: Path) -> Counter[str]:
    """Messages per idempotency key in the fake relay's Maildir, read as a user would:
    every file in new/ and cur/, its Message-ID ``<KEY@DOMAIN>`` parsed."""
    found: Counter[str] = Counter()
    parser = email.parser.BytesHeaderParser()
    for folder in ("new", "cur"):
        for path in sorted((maildir / folder).glob("*")):
            with path.open("rb") as message:
                message_id = str(parser.parse(message)["Message-ID"] or "").strip()
            key, at, _domain = message_id.removeprefix("<").removesuffix(">").rpartition("@")
            if at:
                found[key] += 1
    return found


def emails_per_key(api: str, keys: list[str]) -> Counter[str]:
    """Emails the fake accepted per idempotency key (its lookup by key, and its own
    count header), for the keys the demo published."""
    found: Counter[str] = Counter()
    auth = {"Authorization": f"Bearer {DEMO_EMAIL_API_KEY}"}
    with httpx.Client(base_url=api, headers=auth, timeout=30) as client:
        for key in keys:
            answer = client.get("emails", params={"idempotency_key": key})
            if answer.status_code == 200:
                found[key] = int(answer.headers.get("X-Fake-Messages-With-Key", "1"))
    return found
