"""Every refusal the dashboard answers: one line of JSON (``error``), a ``hint``, and no
data. Never FastAPI's default bodies, never a traceback (the API's ``api/errors.py`` does
the same for the ingest API, with its own body)."""

from __future__ import annotations

import json
import logging
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from starlette.exceptions import HTTPException
from starlette.responses import Response

log = logging.getLogger("ledger.dashboard")

# What a framework refusal (no such route, a method a route does not take) says.
_FRAMEWORK_HINTS = {
    404: "the page is / (a run: /runs/RUN_ID); the data is under /api/ (/api/openapi.json)",
    405: "actions are POSTs from the dashboard's page; everything else is a GET",
}


class Refused(Exception):
    """A request not answered with data: an HTTP status, one line and a hint (and, for an
    unavailable projection, the ``detail`` of what failed and ``headers``)."""

    def __init__(
        self,
        status: int,
        error: str,
        hint: str | None = None,
        *,
        detail: str | None = None,
        headers: dict[str, str] | None = None,
    ) -> None:
        super().__init__(error)
        self.status = status
        self.error = error
        self.hint = hint
        self.detail = detail
        self.headers = headers or {}

    def response(self) -> Response:
        """The JSON answer."""
        body: dict[str, Any] = {"error": self.error}
        if self.detail is not None:
            body["detail"] = self.detail
        if self.hint is not None:
            body["hint"] = self.hint
        return json_answer(body, self.status, self.headers)


def json_answer(data: Any, status: int = 200, headers: dict[str, str] | None = None) -> Response:
    """``data`` as a JSON answer, encoded as it is (no redaction: for the server's own
    words, never for rows)."""
    return Response(json.dumps(data), status, headers, media_type="application/json")


def _query_refusal(errors: list[Any]) -> Refused:
    """A query parameter that is not what its route takes (only integers are typed)."""
    first = errors[0] if errors else {"loc": ("query", "parameter")}
    name = str(list(first.get("loc", ()))[-1])
    return Refused(400, f"{name} must be an integer", f"e.g. ?{name}=50")


def install(app: FastAPI) -> None:
    """Answer every refusal as ``Refused`` does."""

    async def refused(request: Request, exc: Exception) -> Response:
        assert isinstance(exc, Refused)
        return exc.response()

    async def invalid(request: Request, exc: Exception) -> Response:
        assert isinstance(exc, RequestValidationError)
        return _query_refusal(list(exc.errors())).response()

    async def framework(request: Request, exc: Exception) -> Response:
        assert isinstance(exc, HTTPException)
        hint = _FRAMEWORK_HINTS.get(exc.status_code)
        headers = dict(exc.headers or {})
        return Refused(exc.status_code, str(exc.detail), hint, headers=headers).response()

    async def unexpected(request: Request, exc: Exception) -> Response:
        # A bug: logged with its traceback; the caller gets one line, nothing inside.
        log.error("%s %s failed", request.method, request.url.path, exc_info=exc)
        return Refused(500, "internal error", "the dashboard's log has the details").response()

    app.add_exception_handler(Refused, refused)
    app.add_exception_handler(RequestValidationError, invalid)
    app.add_exception_handler(HTTPException, framework)
    app.add_exception_handler(Exception, unexpected)
