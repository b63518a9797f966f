"""The run event routes' bodies, read raw and validated once by their pydantic model
(``model_validate_json``), not by FastAPI's body parsing and dependency solving: the ingest
hot path (BENCHMARKS.md, "a leaner route").

The OpenAPI document stays generated from the same models: each route declares its body
with ``openapi_extra`` (FastAPI's pattern for reading the raw body), a reference to the
model's schema, and ``with_body_schemas`` puts those schemas into the document's
components, as FastAPI would have for a declared body. Bad input is refused as FastAPI
refused it (api/errors.py's ``validation_problem``): 400 for no body or not JSON, 422
naming the field.
"""

from __future__ import annotations

import email.message
from collections.abc import Callable
from typing import Any, TypeVar

from fastapi import Request
from fastapi.openapi.utils import get_openapi
from fastapi.routing import APIRoute
from pydantic import BaseModel, ValidationError

from api.errors import ApiError, validation_problem

M = TypeVar("M", bound=BaseModel)
COMPONENTS = "#/components/schemas/{model}"
# api/auth.py's ``bearer`` scheme, as the reads declare it:
SECURITY: list[dict[str, list[str]]] = [{"ApiKey": []}]

NO_422: dict[int | str, dict[str, Any]] = {422: {"description": "refused"}}
BODIES: list[type[BaseModel]] = []
"""Every model a route reads raw: their schemas go into the OpenAPI components."""


def raw_body(model: type[BaseModel], *, required: bool = True) -> dict[str, Any]:
    """A route's ``openapi_extra``: its JSON body is ``model`` (optional: or null), and it
    takes an API key (the route authenticates with a call, not a dependency)."""
    BODIES.append(model)
    schema: dict[str, Any] = {"$ref": COMPONENTS.format(model=model.__name__)}
    if not required:
        schema = {"anyOf": [schema, {"type": "null"}], "title": "Body"}
    body: dict[str, Any] = {"content": {"application/json": {"schema": schema}}}
    if required:
        body["required"] = True
    return {"requestBody": body, "security": SECURITY}


def with_body_schemas(make: Callable[[], dict[str, Any]]) -> Callable[[], dict[str, Any]]:
    """An app's ``openapi`` that adds the raw bodies' schemas (and what they use) to the
    components."""

    def openapi() -> dict[str, Any]:
        document = make()
        schemas = document.setdefault("components", {}).setdefault("schemas", {})
        if not all(model.__name__ in schemas for model in BODIES):
            for name, schema in body_schemas().items():
                schemas.setdefault(name, schema)
            document["components"]["schemas"] = dict(sorted(schemas.items()))
        return document

    return openapi


def body_schemas() -> dict[str, Any]:
    """The raw bodies' component schemas, made by FastAPI itself: the components of a
    document of one route per model that declares it as its body."""
    routes = [
        # 422 declared, as the routes do: no FastAPI HTTPValidationError schema.
        APIRoute(f"/{model.__name__}", _taking(model), methods=["POST"], responses=NO_422)
        for model in dict.fromkeys(BODIES)
    ]
    document = get_openapi(title="bodies", version="1", routes=routes)
    found: dict[str, Any] = document.get("components", {}).get("schemas", {})
    return found


def _taking(model: type[BaseModel]) -> Callable[..., None]:
    def endpoint(body: Any) -> None:  # pragma: no cover - never called
        raise AssertionError("never called")

    endpoint.__annotations__ = {"body": model, "return": None}
    return endpoint


def is_json(content_type: str | None) -> bool:
    """Whether FastAPI would read a body of this type as JSON (``application/json`` or
    ``+json``; no type: not JSON, FastAPI's strict content type)."""
    if content_type is None:
        return False
    if content_type == "application/json":
        return True
    message = email.message.Message()
    message["content-type"] = content_type
    subtype = message.get_content_subtype()
    return message.get_content_maintype() == "application" and (
        subtype == "json" or subtype.endswith("+json")
    )


async def read_body(request: Request, model: type[M], *, required: bool = True) -> M | None:
    """The request's body as ``model``, validated once, or the refusal (400 or 422 naming
    the field). An empty body: None when not ``required``."""
    raw = await request.body()  # over the size limit: api/limits.py's 413
    if not raw or (not required and raw.strip() == b"null"):
        if required:
            raise ApiError(400, "a JSON body is required", field="body")
        return None
    try:
        if is_json(request.headers.get("content-type")):
            return model.model_validate_json(raw)
        return model.model_validate(raw)  # refused naming the body, as FastAPI does
    except ValidationError as exc:
        status, problem = validation_problem(list(exc.errors()))
        raise ApiError(status, problem.error, field=problem.field, hint=problem.hint) from None
