"""The Slack channel: a message posted with the Web API, the idempotency key in its metadata.

``chat.postMessage`` to the recipient's conversation (``WORKSPACE/CHANNEL_ID``) with the
workspace's bot token, the payload's ``text``/``blocks``/``attachments``, and message
``metadata`` (``event_type`` ``ledger_delivery``, ``event_payload`` with the idempotency
key and the fencing token). ``ok: true`` with a ``ts`` means the message is in the
conversation: CONFIRMED, provider message id ``CHANNEL/TS``. Slack does not dedupe, so a
doubt is settled by a lookup: ``conversations.history`` with ``include_all_metadata``, from
the time the delivery was requested, paged by ``response_metadata.next_cursor`` (bounded),
matching the key in the metadata AND the poster: metadata is only what a poster wrote, and
any app in the conversation may write ours, so only a message our own bot posted (the
``bot_id`` of the workspace's token, from ``auth.test``; and its ``app_id`` where known)
counts as ours.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from dataclasses import dataclass

import httpx
from pydantic import JsonValue

from config.channels import slack_settings
from config.parts import ChannelSettings, WorkerSettings
from events.channels import slack_recipient
from events.keys import canonical_json
from events.outcomes import ErrorClass, LookupOutcome
from streams.channels.base import (
    AdapterBuild,
    LookupResult,
    OutboundDelivery,
    SendOutcome,
    SendResult,
)
from streams.channels.outcomes import (
    Answer,
    DeadlineExceeded,
    attempt_failure,
    non_success,
    request,
    retry_after_seconds,
    string_field,
)
from streams.channels.write_guard import SendRefused, WriteGuard

# The metadata event type of every message the ledger posts; a lookup matches only these.
METADATA_EVENT_TYPE = "ledger_delivery"

# Slack's ``error`` answers that say the message was refused before it was posted, and
# that a retry would meet again: FAILED. (``ratelimited`` is the one "not now".)
PERMANENT_ERRORS = frozenset(
    {
        "channel_not_found",
        "not_in_channel",
        "is_archived",
        "invalid_auth",
        "account_inactive",
        "msg_too_long",
        "invalid_blocks",
        "not_authed",
        "token_revoked",
        "token_expired",
        "missing_scope",
        "no_text",
        "invalid_arguments",
        "invalid_metadata_format",
        "invalid_metadata_schema",
        "metadata_too_large",
        "restricted_action",
        "too_many_attachments",
    }
)
RATELIMITED = "ratelimited"

# Only these payload fields become message arguments. ``thread_ts`` is left out on purpose:
# a thread reply is not in conversations.history, so the lookup could never find it.
MESSAGE_FIELDS = ("text", "blocks", "attachments", "mrkdwn", "unfurl_links", "unfurl_media")

PAGE_SIZE = 200  # Slack's recommended page size for conversations.history


def message_arguments(delivery: OutboundDelivery, channel: str) -> dict[str, JsonValue]:
    """The chat.postMessage arguments of one attempt (JSON body).

    A payload object gives its ``text``/``blocks``/``attachments``/... fields; a payload
    with none of text, blocks or attachments (or not an object) is sent as ``text``: a
    string as it is, anything else as canonical JSON.
    """
    payload = delivery.payload
    arguments: dict[str, JsonValue] = {"channel": channel}
    if isinstance(payload, dict):
        arguments.update({k: payload[k] for k in MESSAGE_FIELDS if k in payload})
    if not any(k in arguments for k in ("text", "blocks", "attachments")):
        text = payload if isinstance(payload, str) else canonical_json(payload).decode()
        arguments["text"] = text
    arguments["metadata"] = {
        "event_type": METADATA_EVENT_TYPE,
        "event_payload": {
            "idempotency_key": delivery.idempotency_key,
            "fencing_token": delivery.fencing_token,
            "attempt": delivery.attempt,
            "run_id": delivery.run_id,
            "event_type": delivery.event_type,
        },
    }
    return arguments


@dataclass(frozen=True)
class BotIdentity:
    """Who our messages are posted by in one workspace: the token's bot (and app)."""

    bot_id: str
    # auth.test does not say it; chat.postMessage's answer does. None: not yet known.
    app_id: str | None = None


def poster_of(message: dict[str, JsonValue]) -> tuple[str | None, str | None]:
    """The ``bot_id`` and ``app_id`` a history message names (``bot_profile`` as fallback)."""
    profile = message.get("bot_profile")
    profile = profile if isinstance(profile, dict) else {}
    bot_id = message.get("bot_id", profile.get("id"))
    app_id = message.get("app_id", profile.get("app_id"))
    return (
        bot_id if isinstance(bot_id, str) else None,
        app_id if isinstance(app_id, str) else None,
    )


def posted_by(message: JsonValue, us: BotIdentity) -> bool:
    """Did our bot post ``message``? Its ``bot_id`` must be ours, and its ``app_id`` too
    where both are known: another app can copy our metadata, never our bot id."""
    if not isinstance(message, dict):
        return False
    bot_id, app_id = poster_of(message)
    if bot_id != us.bot_id:
        return False
    return us.app_id is None or app_id is None or app_id == us.app_id


def carries_key(message: JsonValue, key: str) -> bool:
    """Is ``message`` (one of conversations.history's) a ledger post of ``key``?"""
    if not isinstance(message, dict):
        return False
    metadata = message.get("metadata")
    if not isinstance(metadata, dict) or metadata.get("event_type") != METADATA_EVENT_TYPE:
        return False
    payload = metadata.get("event_payload")
    return isinstance(payload, dict) and payload.get("idempotency_key") == key


class SlackChannel:
    """Slack Web API sender: CONFIRMED on ``ok`` + ``ts``, lookup by key in the metadata."""

    name = "slack"

    def __init__(
        self,
        client: httpx.AsyncClient,
        channels: ChannelSettings,
        worker: WorkerSettings,
        *,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self._client = client
        self._clock = clock
        self._deadline_s = channels.deadline_for(self.name)
        config = slack_settings(channels)
        self._tokens = config.tokens
        self._api = config.api_url
        self._max_pages = config.lookup_max_pages
        # Slack's clock and ours may disagree: a lookup starts this much before the request.
        self._skew_s = worker.clock_skew_margin_s
        # Our bot per workspace (the tokens are fixed for this adapter's life, so the
        # workspace names its token): learnt once by auth.test or from a post's answer.
        self._identities: dict[str, BotIdentity] = {}

    def receiver_dedupes(self, recipient: str) -> bool:
        """False: Slack posts a second message for a second request, whatever its metadata."""
        del recipient
        return False

    def settle_s(self, recipient: str) -> float | None:
        """The default settle window applies."""
        del recipient
        return None

    def _auth(self, workspace: str) -> dict[str, str] | None:
        token = self._tokens.get(workspace)
        if token is None:
            return None
        return {"authorization": f"Bearer {token.get_secret_value()}"}

    async def send(self, delivery: OutboundDelivery, guard: WriteGuard | None = None) -> SendResult:
        """chat.postMessage with the key and the fencing token in the message metadata."""
        url = f"{self._api}chat.postMessage"
        what = f"POST {url} ({delivery.recipient})"
        try:
            workspace, channel = slack_recipient(delivery.recipient)
        except ValueError as exc:
            return SendResult(
                SendOutcome.REJECTED, f"not sent: {exc}", ErrorClass.INVALID_RECIPIENT
            )
        auth = self._auth(workspace)
        if auth is None:
            return SendResult(
                SendOutcome.REJECTED,
                f"not sent: {what}: no bot token for Slack workspace {workspace!r} "
                "(the slack entry's tokens in LEDGER_CHANNELS__SETTINGS)",
                ErrorClass.INVALID_RECIPIENT,
            )
        headers = {"content-type": "application/json; charset=utf-8", **auth}
        try:
            answer = await request(
                self._client,
                "POST",
                url,
                deadline_s=self._deadline_s,
                guard=guard,
                content=canonical_json(message_arguments(delivery, channel)),
                headers=headers,
            )
        except (httpx.RequestError, httpx.InvalidURL, SendRefused, DeadlineExceeded) as exc:
            return attempt_failure(exc, what)
        result = self._classify(answer, what, channel)
        if result.outcome is SendOutcome.CONFIRMED:
            self._learn_from_post(workspace, answer)
        return result

    def _learn_from_post(self, workspace: str, answer: Answer) -> None:
        """chat.postMessage's answer lists the posted message, poster included: our bot."""
        body = answer.json_object()
        message = body.get("message") if body is not None else None
        if not isinstance(message, dict):
            return
        bot_id, app_id = poster_of(message)
        if bot_id is not None:
            self._identities[workspace] = BotIdentity(bot_id, app_id)

    async def _identity(
        self, workspace: str, auth: dict[str, str], deadline_s: float
    ) -> BotIdentity | LookupResult:
        """Our bot in ``workspace`` (cached), or the lookup error saying why it is unknown."""
        known = self._identities.get(workspace)
        if known is not None:
            return known
        url = f"{self._api}auth.test"
        what = f"POST {url} (workspace {workspace!r})"
        try:
            answer = await request(self._client, "POST", url, deadline_s=deadline_s, headers=auth)
        except (httpx.RequestError, httpx.InvalidURL, DeadlineExceeded) as exc:
            return LookupResult(
                LookupOutcome.LOOKUP_ERROR, f"{what}: {type(exc).__name__}: {exc}"[:1000]
            )
        body = answer.json_object()
        if answer.status != 200 or body is None or body.get("ok") is not True:
            return LookupResult(
                LookupOutcome.LOOKUP_ERROR, f"{what} -> {answer.status}: {answer.excerpt()}"[:1000]
            )
        bot_id = string_field(body, "bot_id")
        if bot_id is None:
            return LookupResult(
                LookupOutcome.LOOKUP_ERROR,
                f"{what}: the token has no bot_id (not a bot token?), so our messages cannot "
                "be told from other apps' (the slack entry's tokens are bot tokens, xoxb-)",
            )
        identity = BotIdentity(bot_id, string_field(body, "app_id"))
        self._identities[workspace] = identity
        return identity

    def _classify(self, answer: Answer, what: str, channel: str) -> SendResult:
        if not 200 <= answer.status <= 299:
            # 429 ratelimited: not posted, retried after Retry-After; 5xx: it may have been
            # posted before the failure, so the lookup decides (streams/decisions.py).
            return non_success(answer, what, self._clock)
        body = answer.json_object()
        ok = body.get("ok") if body is not None else None
        error = string_field(body, "error")
        if ok is True:
            ts = string_field(body, "ts")
            posted_in = string_field(body, "channel") or channel
            if ts is None:
                return SendResult(
                    SendOutcome.UNKNOWN,
                    f"{what} -> {answer.status} ok without ts: {answer.excerpt()}"[:1000],
                    ErrorClass.PROTOCOL_ERROR,
                    answer.status,
                )
            evidence = f"{what} -> {answer.status} ok, ts {ts} in {posted_in}"
            if warning := string_field(body, "warning"):
                evidence += f", warning {warning}"
            return SendResult(
                SendOutcome.CONFIRMED,
                evidence,
                http_status=answer.status,
                provider_message_id=f"{posted_in}/{ts}",
                provider_status="posted",
            )
        evidence = f"{what} -> {answer.status}: {answer.excerpt()}"[:1000]
        if ok is False and error in PERMANENT_ERRORS:
            return SendResult(
                SendOutcome.REJECTED, evidence, ErrorClass.PROVIDER_REJECTED, answer.status
            )
        if ok is False and error == RATELIMITED:
            return SendResult(
                SendOutcome.TRANSIENT,
                evidence,
                ErrorClass.HTTP_429,
                answer.status,
                retry_after_s=retry_after_seconds(answer.headers.get("retry-after"), self._clock),
            )
        # An answer we cannot read, or an error we do not know (internal_error,
        # fatal_error, ...): Slack may have posted before failing. Look it up, never guess.
        return SendResult(SendOutcome.UNKNOWN, evidence, ErrorClass.PROTOCOL_ERROR, answer.status)

    async def lookup(self, delivery: OutboundDelivery) -> LookupResult:
        """conversations.history since the request, page by page (at most
        ``LEDGER_CHANNELS__SETTINGS``), for a message whose metadata carries the key
        and that our bot posted (other posters' messages with the key are named, not taken).

        auth.test (once per workspace) and all pages share the hard deadline. "Not found"
        only when the history since the request was read to its end; a history longer than
        the page bound is an error.
        """
        url = f"{self._api}conversations.history"
        try:
            workspace, channel = slack_recipient(delivery.recipient)
        except ValueError as exc:
            return LookupResult(LookupOutcome.LOOKUP_ERROR, str(exc))
        auth = self._auth(workspace)
        if auth is None:
            return LookupResult(
                LookupOutcome.LOOKUP_ERROR,
                f"no bot token for Slack workspace {workspace!r} (the slack entry's tokens in "
                "LEDGER_CHANNELS__SETTINGS)",
            )
        params = {
            "channel": channel,
            "include_all_metadata": "true",
            "limit": str(PAGE_SIZE),
        }
        if delivery.requested_at is not None:
            oldest = delivery.requested_at.timestamp() - self._skew_s
            params["oldest"] = f"{max(oldest, 0.0):.6f}"
        loop = asyncio.get_running_loop()
        ends = loop.time() + self._deadline_s
        us = await self._identity(workspace, auth, self._deadline_s)
        if isinstance(us, LookupResult):
            return us
        what = f"GET {url} ({delivery.recipient})"
        foreign: list[str] = []  # other posters' messages that carry the key
        for page in range(1, self._max_pages + 1):
            left = ends - loop.time()
            if left <= 0:
                return LookupResult(
                    LookupOutcome.LOOKUP_ERROR,
                    f"{what}: the {self._deadline_s:g}s deadline struck at page {page}",
                )
            try:
                answer = await request(
                    self._client, "GET", url, deadline_s=left, headers=auth, params=params
                )
            except (httpx.RequestError, httpx.InvalidURL, DeadlineExceeded) as exc:
                return LookupResult(
                    LookupOutcome.LOOKUP_ERROR, f"{what}: {type(exc).__name__}: {exc}"[:1000]
                )
            body = answer.json_object()
            if answer.status != 200 or body is None or body.get("ok") is not True:
                return LookupResult(
                    LookupOutcome.LOOKUP_ERROR,
                    f"{what} -> {answer.status}: {answer.excerpt()}"[:1000],
                )
            messages = body.get("messages")
            if not isinstance(messages, list):
                return LookupResult(LookupOutcome.LOOKUP_ERROR, f"{what} -> 200 without messages")
            keyed = [m for m in messages if carries_key(m, delivery.idempotency_key)]
            found = [m for m in keyed if posted_by(m, us)]
            foreign += [_describe(m) for m in keyed if not posted_by(m, us)]
            if found:
                # History lists the newest first: the last match is the first post.
                first = found[-1]
                ts = string_field(first, "ts") if isinstance(first, dict) else None
                evidence = (
                    f"{what} -> message ts {ts} by our bot {us.bot_id} carries the key "
                    f"(page {page}, {len(found)} on that page)"
                )
                return LookupResult(
                    LookupOutcome.FOUND,
                    evidence,
                    provider_message_id=f"{channel}/{ts}" if ts else None,
                    provider_status="posted",
                    delivered=True,
                )
            metadata = body.get("response_metadata")
            cursor = string_field(metadata, "next_cursor") if isinstance(metadata, dict) else None
            if body.get("has_more") is not True:
                since = params.get("oldest", "the start")
                others = (
                    f"; not ours, so not taken: {len(foreign)} message(s) by other posters "
                    f"carry it ({', '.join(foreign[:5])})"
                    if foreign
                    else ""
                )
                return LookupResult(
                    LookupOutcome.NOT_FOUND,
                    f"{what}: no message of our bot {us.bot_id} with this key since {since} "
                    f"({page} page(s)){others}"[:1000],
                )
            if cursor is None:  # more history, but no way to read it: not evidence
                return LookupResult(
                    LookupOutcome.LOOKUP_ERROR, f"{what}: has_more without a next_cursor"
                )
            params["cursor"] = cursor
        return LookupResult(
            LookupOutcome.LOOKUP_ERROR,
            f"{what}: more than {self._max_pages} pages of history since the request; "
            "the key may be further back (LEDGER_CHANNELS__SETTINGS)",
        )


def _describe(message: JsonValue) -> str:
    """``ts TS by bot B / app A`` of a message, for evidence."""
    if not isinstance(message, dict):
        return "?"
    bot_id, app_id = poster_of(message)
    ts = string_field(message, "ts")
    user = string_field(message, "user")
    return f"ts {ts} by bot {bot_id} / app {app_id} / user {user}"[:200]


def adapter(build: AdapterBuild) -> SlackChannel:
    """The Slack channel's adapter factory (its plugin: events/channels/builtin.py)."""
    return SlackChannel(build.client, build.channels, build.worker)
