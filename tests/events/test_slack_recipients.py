"""Slack recipients (``WORKSPACE/CHANNEL_ID``) and settings, checked before anything is written."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from clients import DeliverySpec
from config.channels import slack_settings
from config.settings import Settings, with_channel
from events.channels import check_recipient, slack_recipient
from events.errors import ConfigError


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
    settings = with_channel(
        Settings(), "slack", {"tokens": {"acme": "xoxb-1"}, "api_url": "http://127.0.0.1:9/api"}
    )
    assert "xoxb-1" not in repr(settings)
    assert "xoxb-1" not in settings.model_dump_json()
    assert slack_settings(settings.channels).api_url.endswith("/api/")
    with pytest.raises(ConfigError, match="workspace 'a b' must be"):
        slack_settings(with_channel(Settings(), "slack", {"tokens": {"a b": "xoxb-1"}}).channels)
    with pytest.raises(ConfigError, match="http"):
        slack_settings(with_channel(Settings(), "slack", {"api_url": "slack.com/api"}).channels)
