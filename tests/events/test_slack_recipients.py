"""Slack recipients (``WORKSPACE/CHANNEL_ID``) and settings, checked before anything is written."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from clients import DeliverySpec
from config.settings import Settings
from events.channels import check_recipient, slack_recipient


@pytest.mark.parametrize(
    ("recipient", "parts"),
    [("acme/C0123ABCD", ("acme", "C0123ABCD")), ("T01_x-y/G9Z", ("T01_x-y", "G9Z"))],
)
def test_valid_recipients(recipient: str, parts: tuple[str, str]) -> None:
    assert check_recipient("slack", recipient) == recipient
    assert slack_recipient(recipient) == parts


@pytest.mark.parametrize(
    ("recipient", "says"),
    [
        ("C0123ABCD", "must be WORKSPACE/CHANNEL_ID"),
        ("acme/#general", "is not a conversation ID"),
        ("acme/c0123abcd", "is not a conversation ID"),
        ("ac me/C0123", "must be WORKSPACE/CHANNEL_ID"),
        ("https://hooks.slack.com/services/x", "must be WORKSPACE/CHANNEL_ID"),
        ("acme/C0123/extra", "is not a conversation ID"),
    ],
)
def test_invalid_recipients_say_what_is_wrong(recipient: str, says: str) -> None:
    with pytest.raises(ValueError, match=says):
        check_recipient("slack", recipient)
    with pytest.raises(ValidationError, match=says):
        DeliverySpec(channel="slack", recipient=recipient)


def test_tokens_are_secret_and_checked() -> None:
    settings = Settings(slack_tokens={"acme": "xoxb-1"}, slack_api_url="http://127.0.0.1:9/api")
    assert "xoxb-1" not in repr(settings)
    assert "xoxb-1" not in settings.model_dump_json()
    assert settings.slack_api_url.endswith("/api/")
    with pytest.raises(ValidationError, match="workspace 'a b' must be"):
        Settings(slack_tokens={"a b": "xoxb-1"})
    with pytest.raises(ValidationError, match="http"):
        Settings(slack_api_url="slack.com/api")
