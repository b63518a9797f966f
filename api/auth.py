"""Who is calling: an API key (``Authorization: Bearer dlk_...``) that names its agent,
checked against the keys followed from ``ledger.api_keys``; and its rate."""

from __future__ import annotations

import asyncio
import time
from typing import Annotated

from fastapi import Depends, Request
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer

from api.errors import ApiError
from api.limits import retry_after
from api.services import Services, services
from events.api_keys import ApiKey

KEYS_WAIT_S = 5.0

bearer = HTTPBearer(
    auto_error=False,
    scheme_name="ApiKey",
    description="An API key, made by `ledger api-keys create --agent NAME`.",
)


def bearer_token(authorization: str | None) -> str | None:
    """The key of an ``Authorization: Bearer <key>`` header, or None (what ``bearer``
    gives the dependency, without the dependency)."""
    if not authorization:
        return None
    scheme, _, token = authorization.partition(" ")
    token = token.strip()
    if not scheme or not token or scheme.lower() != "bearer":
        return None
    return token


async def authenticate(request: Request) -> ApiKey:
    """The live key of the request, as a plain call (the run event routes read their
    body themselves: no dependency solving): 401 without one, 429 over its rate, 503
    while the keys are still being read at start."""
    return await key_of(services(request), bearer_token(request.headers.get("authorization")))


async def caller(
    request: Request,
    credentials: Annotated[HTTPAuthorizationCredentials | None, Depends(bearer)],
) -> ApiKey:
    """``authenticate`` as a dependency (the reads)."""
    return await key_of(services(request), credentials.credentials if credentials else None)


async def key_of(held: Services, token: str | None) -> ApiKey:
    """The live key ``token`` names, or the refusal."""
    if not held.keys.caught_up.is_set():
        try:
            await asyncio.wait_for(held.keys.caught_up.wait(), KEYS_WAIT_S)
        except TimeoutError:
            raise ApiError(
                503,
                "the API keys are still being read from the log",
                hint="retry in a few seconds",
                headers={"Retry-After": "5"},
            ) from None
    if token is None:
        raise ApiError(
            401,
            "no API key: send 'Authorization: Bearer <API key>'",
            field="Authorization",
            hint="an operator makes one with 'ledger api-keys create --agent NAME'",
            headers={"WWW-Authenticate": "Bearer"},
        )
    key = held.keys.agent_of(token)
    if key is None:
        # Unknown, wrong or revoked: one answer, so a guess learns nothing.
        raise ApiError(
            401,
            "the API key is not valid (unknown or revoked)",
            field="Authorization",
            hint="'ledger api-keys list' shows the live keys",
            headers={"WWW-Authenticate": 'Bearer error="invalid_token"'},
        )
    wait = held.limiter.wait_s(key.key_id, time.monotonic())
    if wait > 0:
        settings = held.settings.api
        raise ApiError(
            429,
            f"API key {key.key_id} is over its rate of {settings.rate_per_key_s:g} "
            f"requests/s (burst {settings.burst_per_key})",
            field="Authorization",
            hint=f"retry after {retry_after(wait)} s (LEDGER_API__RATE_PER_KEY_S)",
            headers={"Retry-After": retry_after(wait)},
        )
    return key


Caller = Annotated[ApiKey, Depends(caller)]
