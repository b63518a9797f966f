"""The fake Slack Web API against the official ``slack_sdk`` clients: every answer parses,
and every error answer comes out as the SDK's own ``SlackApiError``."""

from __future__ import annotations

import json

import httpx
import pytest
from slack_sdk import WebClient
from slack_sdk.errors import SlackApiError
from slack_sdk.web.async_client import AsyncWebClient

from ledger.simulator.slack import APP_ID, BOT_ID, BOT_USER
from tests.fixtures.slack import (
    CHANNEL,
    OTHER_APP,
    OTHER_TOKEN,
    TOKEN,
    WORKSPACE,
    BackgroundFakeSlack,
    FakeSlackFactory,
)

METADATA = {"event_type": "ledger_delivery", "event_payload": {"idempotency_key": "k1"}}


def client(fake: BackgroundFakeSlack, token: str = TOKEN, timeout: int = 10) -> WebClient:
    return WebClient(token=token, base_url=fake.api_url, timeout=timeout)


def test_post_message_and_history_parse(fake_slack: BackgroundFakeSlack) -> None:
    sdk = client(fake_slack)
    posted = sdk.chat_postMessage(channel=CHANNEL, text="report ready", metadata=METADATA)
    assert posted["ok"] is True
    assert posted["channel"] == CHANNEL
    assert posted["message"]["text"] == "report ready"
    assert posted["message"]["metadata"] == METADATA
    history = sdk.conversations_history(channel=CHANNEL, include_all_metadata=True)
    assert history["ok"] is True
    assert history["has_more"] is False
    assert [m["ts"] for m in history["messages"]] == [posted["ts"]]
    assert history["messages"][0]["metadata"] == METADATA
    # Without include_all_metadata the metadata is not listed, as in Slack.
    plain = sdk.conversations_history(channel=CHANNEL)
    assert "metadata" not in plain["messages"][0]


def test_history_pages_by_next_cursor_newest_first(fake_slack: BackgroundFakeSlack) -> None:
    sdk = client(fake_slack)
    stamps = [sdk.chat_postMessage(channel=CHANNEL, text=f"m{i}")["ts"] for i in range(5)]
    # The SDK's own pagination follows response_metadata.next_cursor (and reuses one
    # response object, so each page is read as it comes).
    pages = [list(page["messages"]) for page in sdk.conversations_history(channel=CHANNEL, limit=2)]
    assert [len(p) for p in pages] == [2, 2, 1]
    listed = [m["ts"] for p in pages for m in p]
    assert listed == list(reversed(stamps))
    middle = sdk.conversations_history(channel=CHANNEL, oldest=stamps[1], latest=stamps[3])
    assert [m["ts"] for m in middle["messages"]] == [stamps[2]]


def test_form_encoded_post_with_token_in_the_body(fake_slack: BackgroundFakeSlack) -> None:
    sdk = WebClient(base_url=fake_slack.api_url)
    answer = sdk.api_call(
        "chat.postMessage",
        data={
            "token": TOKEN,
            "channel": CHANNEL,
            "text": "form",
            "metadata": json.dumps(METADATA),
        },
    )
    assert answer["ok"] is True
    assert fake_slack.fake.messages("k1")[0].body["metadata"] == METADATA


def test_json_without_charset_is_answered_with_a_warning(fake_slack: BackgroundFakeSlack) -> None:
    answer = httpx.post(
        f"{fake_slack.api_url}chat.postMessage",
        content=json.dumps({"channel": CHANNEL, "text": "hi"}),
        headers={"authorization": f"Bearer {TOKEN}", "content-type": "application/json"},
    ).json()
    assert answer["ok"] is True
    assert answer["warning"] == "missing_charset"
    assert answer["response_metadata"]["warnings"] == ["missing_charset"]


@pytest.mark.parametrize(
    ("token", "channel", "text", "error"),
    [
        ("xoxb-wrong", CHANNEL, "x", "invalid_auth"),
        (None, CHANNEL, "x", "not_authed"),
        (TOKEN, "C0NOSUCH", "x", "channel_not_found"),
        (TOKEN, CHANNEL, "", "no_text"),
        (TOKEN, CHANNEL, "x" * 40_001, "msg_too_long"),
    ],
)
def test_error_answers_are_slack_api_errors(
    fake_slack: BackgroundFakeSlack, token: str | None, channel: str, text: str, error: str
) -> None:
    sdk = WebClient(token=token, base_url=fake_slack.api_url)
    with pytest.raises(SlackApiError) as raised:
        sdk.chat_postMessage(channel=channel, text=text)
    assert raised.value.response["ok"] is False
    assert raised.value.response["error"] == error
    assert fake_slack.fake.messages() == []


def test_invalid_blocks_and_metadata(fake_slack: BackgroundFakeSlack) -> None:
    sdk = client(fake_slack)
    with pytest.raises(SlackApiError) as raised:
        sdk.api_call("chat.postMessage", json={"channel": CHANNEL, "blocks": [{"text": "x"}]})
    assert raised.value.response["error"] == "invalid_blocks"
    with pytest.raises(SlackApiError) as raised:
        sdk.api_call(
            "chat.postMessage", json={"channel": CHANNEL, "text": "x", "metadata": {"a": 1}}
        )
    assert raised.value.response["error"] == "invalid_metadata_format"


def test_ratelimited_is_429_with_retry_after(fake_slack: BackgroundFakeSlack) -> None:
    fake_slack.fake.fault("ratelimited", retry_after=7)
    with pytest.raises(SlackApiError) as raised:
        client(fake_slack).chat_postMessage(channel=CHANNEL, text="x")
    response = raised.value.response
    assert (response.status_code, response["error"]) == (429, "ratelimited")
    assert response.headers["Retry-After"] == "7"
    assert fake_slack.fake.messages() == []


def test_500_after_post_is_an_error_and_the_message_is_there(
    fake_slack: BackgroundFakeSlack,
) -> None:
    fake_slack.fake.fault("error_after_post")
    with pytest.raises(SlackApiError) as raised:
        client(fake_slack).chat_postMessage(channel=CHANNEL, text="x", metadata=METADATA)
    assert (raised.value.response.status_code, raised.value.response["error"]) == (
        500,
        "internal_error",
    )
    assert fake_slack.posted("k1") == 1


def test_injected_channel_not_found_posts_nothing(fake_slack: BackgroundFakeSlack) -> None:
    fake_slack.fake.fault("error", error="channel_not_found", key="k1")
    with pytest.raises(SlackApiError) as raised:
        client(fake_slack).chat_postMessage(channel=CHANNEL, text="x", metadata=METADATA)
    assert raised.value.response["error"] == "channel_not_found"
    assert fake_slack.posted("k1") == 0


def test_timeout_after_post_leaves_the_message(fake_slack_factory: FakeSlackFactory) -> None:
    fake = fake_slack_factory()
    fake.fake.fault("timeout_after_post", delay_s=3)
    with pytest.raises(TimeoutError):
        client(fake, timeout=1).chat_postMessage(channel=CHANNEL, text="x", metadata=METADATA)
    assert fake.posted("k1") == 1


def test_no_dedupe_a_second_post_is_a_second_message(fake_slack: BackgroundFakeSlack) -> None:
    sdk = client(fake_slack)
    sdk.chat_postMessage(channel=CHANNEL, text="x", metadata=METADATA)
    sdk.chat_postMessage(channel=CHANNEL, text="x", metadata=METADATA)
    assert fake_slack.posted("k1") == 2


async def test_async_client_parses_and_raises(fake_slack: BackgroundFakeSlack) -> None:
    sdk = AsyncWebClient(token=TOKEN, base_url=fake_slack.api_url)
    posted = await sdk.chat_postMessage(channel=CHANNEL, text="async", metadata=METADATA)
    history = await sdk.conversations_history(channel=CHANNEL, include_all_metadata=True)
    assert history["messages"][0]["ts"] == posted["ts"]
    with pytest.raises(SlackApiError) as raised:
        await sdk.conversations_history(channel="C0NOSUCH")
    assert raised.value.response["error"] == "channel_not_found"


def test_auth_test_and_every_message_name_the_poster(fake_slack: BackgroundFakeSlack) -> None:
    # As Slack: auth.test gives a bot token's bot user and bot id; a bot's message carries
    # user, bot_id, app_id and bot_profile, in the post's answer and in the history.
    ours, other = client(fake_slack), client(fake_slack, OTHER_TOKEN)
    me = ours.auth_test()
    assert (me["ok"], me["team_id"], me["user_id"], me["bot_id"]) == (
        True,
        WORKSPACE,
        BOT_USER,
        BOT_ID,
    )
    assert other.auth_test()["bot_id"] == OTHER_APP.bot_id != BOT_ID
    posted = ours.chat_postMessage(channel=CHANNEL, text="ours", metadata=METADATA)
    assert (posted["message"]["bot_id"], posted["message"]["app_id"]) == (BOT_ID, APP_ID)
    assert posted["message"]["bot_profile"]["app_id"] == APP_ID
    other.chat_postMessage(channel=CHANNEL, text="theirs", metadata=METADATA)
    history = ours.conversations_history(channel=CHANNEL, include_all_metadata=True)
    posters = [(m["text"], m["bot_id"], m["app_id"], m["user"]) for m in history["messages"]]
    assert posters == [
        ("theirs", OTHER_APP.bot_id, OTHER_APP.app_id, OTHER_APP.user_id),
        ("ours", BOT_ID, APP_ID, BOT_USER),
    ]
    assert fake_slack.posted("k1") == 1  # ours only
    assert len(fake_slack.fake.messages("k1")) == 2
    with pytest.raises(SlackApiError) as raised:
        client(fake_slack, "xoxb-nobody").auth_test()
    assert raised.value.response["error"] == "invalid_auth"
