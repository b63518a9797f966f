"""A fake Slack Web API on loopback: ``auth.test``, ``chat.postMessage``, ``conversations.history``.

It follows the real request and response shapes (form, query or JSON arguments; the bot
token as ``Authorization: Bearer``, or ``token`` in a form; ``ok``/``error``, ``warning``
and ``response_metadata``; HTTP 429 with ``Retry-After`` for ``ratelimited``), keeps each
conversation's history with its messages' metadata and poster (``user``, ``bot_id``,
``app_id``, ``bot_profile``, as Slack lists a bot's message), and does NOT dedupe: a second post is
a second message, so a double send shows. Faults on command: a timeout or a 500 after the
message was posted, ``ratelimited``, or any Slack error (``channel_not_found``) answered
before posting. ``slack_sdk``'s clients parse every answer (tests/ledger/test_fake_slack.py).
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import enum
import json
import random
import threading
import time
from dataclasses import dataclass, field
from typing import Any

from aiohttp import web
from pydantic import BaseModel, ConfigDict, Field

from events.channels.urls import SLACK_CHANNEL_ID
from ledger.simulator.app_server import AppServer

MAX_TEXT = 40_000  # Slack truncates past 40,000 characters and refuses longer: msg_too_long
# The identity of the ledger's bot: every token in ``FakeSlackConfig.tokens`` is this app's.
BOT_USER = "U0LEDGERBOT"
BOT_ID = "B0LEDGERBOT"
APP_ID = "A0LEDGERAPP"
BOT_NAME = "ledger"


class SlackFaultKind(enum.StrEnum):
    """What goes wrong with one call, and whether the message was posted first."""

    TIMEOUT_AFTER_POST = "timeout_after_post"  # posted, answered only after delay_s
    ERROR_AFTER_POST = "error_after_post"  # posted, then HTTP `status` (500)
    RATELIMITED = "ratelimited"  # HTTP 429 + Retry-After; nothing posted
    ERROR = "error"  # ok:false with `error` (channel_not_found); nothing posted


class SlackFault(BaseModel):
    """A fault for the next ``count`` calls of ``method`` matching ``key`` and ``channel``."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    kind: SlackFaultKind
    count: int = Field(default=1, ge=1, le=1_000_000)
    method: str = "chat.postMessage"
    key: str | None = None  # the idempotency key in the message metadata
    channel: str | None = None
    delay_s: float = Field(default=10.0, ge=0, le=300)
    status: int = Field(default=500, ge=500, le=599)
    retry_after: int = Field(default=1, ge=0, le=3600)
    error: str = "channel_not_found"


class FakeSlackApp(BaseModel):
    """Another app installed in a workspace: its own bot token, bot user, bot and app ids."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    workspace: str
    token: str
    name: str = "other-app"
    bot_id: str = "B0OTHERBOT"
    app_id: str = "A0OTHERAPP"
    user_id: str = "U0OTHERBOT"


class FakeSlackConfig(BaseModel):
    """Where it listens, the workspaces (name -> the ledger's bot token), other apps'
    tokens, and the conversations."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    host: str = "127.0.0.1"
    port: int = Field(default=0, ge=0, le=65535)
    tokens: dict[str, str] = Field(default_factory=dict)
    # Other apps in the same workspaces: they may post anything, metadata included.
    apps: list[FakeSlackApp] = Field(default_factory=list)
    # Conversation IDs that exist in every workspace; any other is channel_not_found.
    channels: list[str] = Field(default_factory=lambda: ["C0LEDGER01"])
    # Random faults on chat.postMessage, by fraction, from a seeded generator.
    seed: int = 0
    timeout_share: float = Field(default=0.0, ge=0, le=1)
    error_share: float = Field(default=0.0, ge=0, le=1)
    ratelimit_share: float = Field(default=0.0, ge=0, le=1)
    delay_s: float = Field(default=10.0, ge=0, le=300)


@dataclass(frozen=True)
class SlackMessage:
    """One message in a conversation's history, as Slack would list it."""

    workspace: str
    channel: str
    ts: str
    body: dict[str, Any]

    @property
    def key(self) -> str | None:
        """The idempotency key in its metadata, if any."""
        payload = (self.body.get("metadata") or {}).get("event_payload")
        value = payload.get("idempotency_key") if isinstance(payload, dict) else None
        return value if isinstance(value, str) else None

    @property
    def bot_id(self) -> str | None:
        """The bot that posted it (``BOT_ID``: the ledger's)."""
        value = self.body.get("bot_id")
        return value if isinstance(value, str) else None

    def listed(self, with_metadata: bool) -> dict[str, Any]:
        """The message as conversations.history shows it (metadata only when asked for)."""
        if with_metadata:
            return dict(self.body)
        return {k: v for k, v in self.body.items() if k != "metadata"}


@dataclass(frozen=True)
class SlackCall:
    """One API call as the fake saw it."""

    method: str
    http_method: str
    key: str | None
    status: int
    error: str | None
    at: float


@dataclass
class _State:
    lock: threading.Lock = field(default_factory=threading.Lock)
    histories: dict[tuple[str, str], list[SlackMessage]] = field(default_factory=dict)
    calls: list[SlackCall] = field(default_factory=list)
    faults: list[tuple[SlackFault, int]] = field(default_factory=list)
    last_ts: float = 0.0


class SlackError(Exception):
    """An ``ok: false`` answer."""

    def __init__(self, error: str, status: int = 200) -> None:
        super().__init__(error)
        self.error = error
        self.status = status


class FakeSlack:
    """The fake Web API server; ``async with`` starts and stops it. Thread-safe reads."""

    def __init__(self, config: FakeSlackConfig | None = None) -> None:
        self.config = config or FakeSlackConfig()
        self.port = 0
        self._state = _State()
        self._rng = random.Random(self.config.seed)  # noqa: S311 - fault injection
        self._server = AppServer()

    @property
    def api_url(self) -> str:
        """The Web API base (``LEDGER_CHANNELS__SETTINGS``, ``WebClient(base_url=...)``)."""
        return f"http://{self.config.host}:{self.port}/api/"

    # -- lifecycle ----------------------------------------------------------------------------

    async def start(self) -> None:
        """Bind the port and serve."""
        app = web.Application()
        app.router.add_route("*", "/api/{method}", self._handle)
        self.port = await self._server.serve(app, self.config.host, self.config.port)

    async def stop(self) -> None:
        """Stop serving."""
        await self._server.stop()

    async def __aenter__(self) -> FakeSlack:
        await self.start()
        return self

    async def __aexit__(self, *_exc: object) -> None:
        await self.stop()

    # -- control and observation (any thread) ------------------------------------------------

    def fault(self, kind: SlackFaultKind | str, **fields: Any) -> SlackFault:
        """Arm a fault for the next matching calls (count, method, key, channel, ...)."""
        fault = SlackFault(kind=SlackFaultKind(kind), **fields)
        with self._state.lock:
            self._state.faults.append((fault, fault.count))
        return fault

    def history(self, workspace: str, channel: str) -> list[SlackMessage]:
        """A conversation's messages, oldest first."""
        with self._state.lock:
            return list(self._state.histories.get((workspace, channel), []))

    def messages(self, key: str | None = None, bot_id: str | None = None) -> list[SlackMessage]:
        """Every posted message (with ``key``: those carrying it; with ``bot_id``: those
        that bot posted), oldest first."""
        with self._state.lock:
            every = [m for h in self._state.histories.values() for m in h]
        chosen = (m for m in every if key in (None, m.key) and bot_id in (None, m.bot_id))
        return sorted(chosen, key=lambda m: m.ts)

    def calls(self, method: str | None = None, key: str | None = None) -> list[SlackCall]:
        """The call log, optionally by API method and key."""
        with self._state.lock:
            calls = list(self._state.calls)
        return [c for c in calls if (method in (None, c.method)) and (key in (None, c.key))]

    # -- the API ------------------------------------------------------------------------------

    async def _handle(self, request: web.Request) -> web.StreamResponse:
        method = request.match_info["method"]
        warnings: list[str] = []
        key: str | None = None
        try:
            args = await self._arguments(request, warnings)
            poster = self._authenticate(request, args)
            key = _metadata_key(args.get("metadata"))
            fault = self._take_fault(method, key, args.get("channel"))
            if fault is not None and fault.kind is SlackFaultKind.RATELIMITED:
                self._record(method, request.method, key, 429, "ratelimited")
                return web.json_response(
                    {"ok": False, "error": "ratelimited"},
                    status=429,
                    headers={"Retry-After": str(fault.retry_after)},
                )
            if fault is not None and fault.kind is SlackFaultKind.ERROR:
                raise SlackError(fault.error)
            if method == "chat.postMessage":
                answer = self._post(poster, args)
            elif method == "conversations.history":
                answer = self._history(poster.workspace, args)
            elif method == "auth.test":
                answer = _auth_test(poster)
            else:
                raise SlackError("unknown_method")
        except SlackError as exc:
            self._record(method, request.method, key, exc.status, exc.error)
            return _answer({"ok": False, "error": exc.error}, warnings, exc.status)
        if fault is not None and fault.kind is SlackFaultKind.ERROR_AFTER_POST:
            self._record(method, request.method, key, fault.status, "internal_error")
            return web.json_response({"ok": False, "error": "internal_error"}, status=fault.status)
        # Recorded before a late answer: the client may hang up and cancel this handler.
        self._record(method, request.method, key, 200, None)
        if fault is not None and fault.kind is SlackFaultKind.TIMEOUT_AFTER_POST:
            await asyncio.sleep(fault.delay_s)
        return _answer(answer, warnings)

    async def _arguments(self, request: web.Request, warnings: list[str]) -> dict[str, Any]:
        args: dict[str, Any] = dict(request.query)
        if request.method not in ("POST", "GET"):
            raise SlackError("method_not_supported_for_channel_type")
        if request.method == "POST" and request.content_type == "application/json":
            if "charset" not in request.headers.get("content-type", "").lower():
                warnings.append("missing_charset")
            try:
                body = json.loads(await request.read())
            except ValueError:
                raise SlackError("invalid_json") from None
            if not isinstance(body, dict):
                raise SlackError("invalid_json")
            args.update(body)
        elif request.method == "POST":
            args.update({k: v for k, v in (await request.post()).items() if isinstance(v, str)})
        return args

    def _authenticate(self, request: web.Request, args: dict[str, Any]) -> FakeSlackApp:
        header = request.headers.get("authorization", "")
        token = header[7:].strip() if header.lower().startswith("bearer ") else None
        if token is None and request.content_type != "application/json":
            token = args.get("token") if isinstance(args.get("token"), str) else None
        if not token:
            raise SlackError("not_authed")
        for workspace, known in self.config.tokens.items():
            if known == token:
                return FakeSlackApp(
                    workspace=workspace,
                    token=known,
                    name=BOT_NAME,
                    bot_id=BOT_ID,
                    app_id=APP_ID,
                    user_id=BOT_USER,
                )
        for app in self.config.apps:
            if app.token == token:
                return app
        raise SlackError("invalid_auth")

    def _take_fault(self, method: str, key: str | None, channel: object) -> SlackFault | None:
        with self._state.lock:
            for index, (fault, left) in enumerate(self._state.faults):
                if fault.method != method or fault.key not in (None, key):
                    continue
                if fault.channel not in (None, channel):
                    continue
                if left <= 1:
                    del self._state.faults[index]
                else:
                    self._state.faults[index] = (fault, left - 1)
                return fault
            if method != "chat.postMessage":
                return None
            draw = self._rng.random()
            c = self.config
            for kind, share in (
                (SlackFaultKind.TIMEOUT_AFTER_POST, c.timeout_share),
                (SlackFaultKind.ERROR_AFTER_POST, c.error_share),
                (SlackFaultKind.RATELIMITED, c.ratelimit_share),
            ):
                if draw < share:
                    return SlackFault(kind=kind, delay_s=c.delay_s)
                draw -= share
        return None

    def _channel(self, args: dict[str, Any]) -> str:
        channel = args.get("channel")
        if not isinstance(channel, str) or channel not in self.config.channels:
            raise SlackError("channel_not_found")
        return channel

    def _post(self, poster: FakeSlackApp, args: dict[str, Any]) -> dict[str, Any]:
        workspace = poster.workspace
        channel = self._channel(args)
        text, blocks, attachments = args.get("text"), args.get("blocks"), args.get("attachments")
        blocks = _json_argument(blocks, "invalid_blocks")
        attachments = _json_argument(attachments, "invalid_attachments")
        if blocks is not None and not (
            isinstance(blocks, list) and all(isinstance(b, dict) and "type" in b for b in blocks)
        ):
            raise SlackError("invalid_blocks")
        if not text and not blocks and not attachments:
            raise SlackError("no_text")
        if text is not None and not isinstance(text, str):
            raise SlackError("invalid_arguments")
        if text and len(text) > MAX_TEXT:
            raise SlackError("msg_too_long")
        metadata = _json_argument(args.get("metadata"), "invalid_metadata_format")
        if metadata is not None and not (
            isinstance(metadata, dict)
            and isinstance(metadata.get("event_type"), str)
            and isinstance(metadata.get("event_payload"), dict)
        ):
            raise SlackError("invalid_metadata_format")
        with self._state.lock:
            # Strictly increasing per fake: a ts is unique in its conversation, as in Slack.
            stamp = max(time.time(), self._state.last_ts + 0.000001)
            self._state.last_ts = stamp
            ts = f"{stamp:.6f}"
            # As Slack lists a message a bot token posted: who posted it, by bot and app.
            body: dict[str, Any] = {
                "type": "message",
                "user": poster.user_id,
                "bot_id": poster.bot_id,
                "app_id": poster.app_id,
                "text": text or "",
                "ts": ts,
                "team": workspace,
                "bot_profile": {
                    "id": poster.bot_id,
                    "app_id": poster.app_id,
                    "name": poster.name,
                    "deleted": False,
                    "team_id": workspace,
                },
            }
            if blocks:
                body["blocks"] = blocks
            if attachments:
                body["attachments"] = attachments
            if metadata is not None:
                body["metadata"] = {
                    "event_type": metadata["event_type"],
                    "event_payload": metadata["event_payload"],
                }
            message = SlackMessage(workspace, channel, ts, body)
            self._state.histories.setdefault((workspace, channel), []).append(message)
        return {"ok": True, "channel": channel, "ts": ts, "message": body}

    def _history(self, workspace: str, args: dict[str, Any]) -> dict[str, Any]:
        channel = self._channel(args)
        try:
            limit = min(max(int(args.get("limit", 100)), 1), 999)
            oldest = float(args.get("oldest") or 0)
            latest = float(args.get("latest") or time.time() + 1)
        except (TypeError, ValueError):
            raise SlackError("invalid_arguments") from None
        inclusive = str(args.get("inclusive", "")).lower() in ("1", "true")
        with_metadata = str(args.get("include_all_metadata", "")).lower() in ("1", "true")
        newest_first = sorted(self.history(workspace, channel), key=lambda m: -float(m.ts))
        window = [
            m
            for m in newest_first
            if (oldest <= float(m.ts) if inclusive else oldest < float(m.ts))
            and (float(m.ts) <= latest if inclusive else float(m.ts) < latest)
        ]
        cursor = args.get("cursor")
        if cursor:
            start = _cursor_ts(str(cursor))
            window = [m for m in window if float(m.ts) <= start]
        page, rest = window[:limit], window[limit:]
        next_cursor = _make_cursor(rest[0].ts) if rest else ""
        return {
            "ok": True,
            "messages": [m.listed(with_metadata) for m in page],
            "has_more": bool(rest),
            "pin_count": 0,
            "channel_actions_ts": None,
            "channel_actions_count": 0,
            "response_metadata": {"next_cursor": next_cursor},
        }

    def _record(
        self, method: str, http_method: str, key: str | None, status: int, error: str | None
    ) -> None:
        with self._state.lock:
            self._state.calls.append(
                SlackCall(method, http_method, key, status, error, time.monotonic())
            )


def _auth_test(poster: FakeSlackApp) -> dict[str, Any]:
    """auth.test's answer for a bot token: the workspace, the bot user and the bot id.

    Slack's answer carries ``bot_id`` but no ``app_id``; the fake does the same.
    """
    return {
        "ok": True,
        "url": f"https://{poster.workspace}.slack.com/",
        "team": poster.workspace,
        "user": poster.name,
        "team_id": poster.workspace,
        "user_id": poster.user_id,
        "bot_id": poster.bot_id,
        "is_enterprise_install": False,
    }


def _answer(body: dict[str, Any], warnings: list[str], status: int = 200) -> web.Response:
    if warnings:
        body["warning"] = ",".join(warnings)
        meta = body.setdefault("response_metadata", {})
        meta["warnings"] = warnings
    return web.json_response(body, status=status)


def _json_argument(value: object, error: str) -> object:
    """Form arguments carry JSON as strings (blocks, attachments, metadata); JSON bodies
    carry it as values. Both are accepted, as Slack does."""
    if not isinstance(value, str):
        return value
    if value == "":
        return None
    try:
        return json.loads(value)
    except ValueError:
        raise SlackError(error) from None


def _metadata_key(metadata: object) -> str | None:
    try:
        value = _json_argument(metadata, "invalid_metadata_format")
    except SlackError:
        return None
    payload = value.get("event_payload") if isinstance(value, dict) else None
    key = payload.get("idempotency_key") if isinstance(payload, dict) else None
    return key if isinstance(key, str) else None


def _make_cursor(ts: str) -> str:
    # Slack's cursors are opaque base64 ("next_ts:..."): the same shape here.
    return base64.b64encode(f"next_ts:{ts}".encode()).decode()


def _cursor_ts(cursor: str) -> float:
    try:
        text = base64.b64decode(cursor, validate=True).decode()
        prefix, _, ts = text.partition(":")
        if prefix != "next_ts":
            raise ValueError(cursor)
        return float(ts)
    except (binascii.Error, UnicodeDecodeError, ValueError):
        raise SlackError("invalid_cursor") from None


def check_channel_ids(channels: list[str]) -> list[str]:
    """Refuse a conversation ID the ledger's Slack recipients could not name."""
    for channel in channels:
        if not SLACK_CHANNEL_ID.fullmatch(channel):
            raise ValueError(
                f"{channel[:40]!r} is not a Slack conversation ID (C/G/D + 2-20 capitals or "
                "digits, e.g. C0123ABCD)"
            )
    return channels
