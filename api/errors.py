"""Every error the API answers: a 4xx or 503 with one line of JSON (``Problem``) that names
the field it is about. Never FastAPI's default bodies, never a 5xx for bad input, never
the input itself echoed (a recipient may carry a secret, a payload anything).
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from api.models import Problem

log = logging.getLogger("ledger.api")


class ApiError(Exception):
    """An answer other than success: ``status``, one line, the field, a hint."""

    def __init__(
        self,
        status: int,
        error: str,
        *,
        field: str | None = None,
        hint: str | None = None,
        headers: dict[str, str] | None = None,
    ) -> None:
        super().__init__(error)
        self.status = status
        self.problem = Problem(error=_one_line(error), field=field, hint=hint)
        self.headers = headers or {}

    def response(self) -> JSONResponse:
        """The JSON answer."""
        return problem_response(self.status, self.problem, self.headers)


def problem_response(
    status: int, problem: Problem, headers: dict[str, str] | None = None
) -> JSONResponse:
    """``problem`` as the body of a ``status`` answer."""
    return JSONResponse(problem.model_dump(), status_code=status, headers=headers)


def field_path(loc: Sequence[int | str]) -> str:
    """A pydantic error location as a field path: ``deliveries[0].recipient``."""
    parts = list(loc)
    if parts and parts[0] in ("body", "path", "query", "header"):
        parts = parts[1:]
    shown = ""
    for part in parts:
        if isinstance(part, int):
            shown += f"[{part}]"
        else:
            shown += f".{part}" if shown else str(part)
    return shown or "body"


def _one_line(text: str) -> str:
    text = " ".join(text.split())
    return text if len(text) <= 500 else text[:499] + "…"


def validation_problem(errors: list[Any]) -> tuple[int, Problem]:
    """The first of a request's validation errors, named by its field (never its input)."""
    first = errors[0] if errors else {"loc": ("body",), "msg": "invalid request", "type": ""}
    where = field_path(first.get("loc", ()))
    kind = first.get("type", "")
    message = str(first.get("msg", "invalid")).removeprefix("Value error, ")
    if kind == "json_invalid":
        return 400, Problem(
            error=f"the body is not JSON: {message}", field="body", hint="send a JSON object"
        )
    if kind == "missing" and where == "body":
        return 400, Problem(error="a JSON body is required", field="body")
    more = f" (and {len(errors) - 1} more)" if len(errors) > 1 else ""
    return 422, Problem(error=_one_line(f"{where}: {message}{more}"), field=where)


def install(app: FastAPI) -> None:
    """Answer every error as a ``Problem``."""

    async def api_error(request: Request, exc: Exception) -> JSONResponse:
        assert isinstance(exc, ApiError)
        return exc.response()

    async def invalid(request: Request, exc: Exception) -> JSONResponse:
        assert isinstance(exc, RequestValidationError)
        status, problem = validation_problem(list(exc.errors()))
        return problem_response(status, problem)

    async def http_error(request: Request, exc: Exception) -> JSONResponse:
        assert isinstance(exc, StarletteHTTPException)
        text = exc.detail if isinstance(exc.detail, str) else "refused"
        return problem_response(exc.status_code, Problem(error=text), dict(exc.headers or {}))

    async def unexpected(request: Request, exc: Exception) -> JSONResponse:
        # A bug: logged with its traceback; the caller gets one line, nothing inside.
        log.error("%s %s failed", request.method, request.url.path, exc_info=exc)
        return problem_response(
            500, Problem(error="internal error", hint="the API's log has the details")
        )

    app.add_exception_handler(ApiError, api_error)
    app.add_exception_handler(RequestValidationError, invalid)
    app.add_exception_handler(StarletteHTTPException, http_error)
    app.add_exception_handler(Exception, unexpected)
