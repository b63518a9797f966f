"""The HTTP ingest API (``ledger api``): agents in any language publish runs over HTTP,
with the same atomic Kafka transaction and group commit as the SDK, idempotent by run id.

FastAPI on uvicorn: its OpenAPI 3.1 (``/openapi.json``) is generated from the same
pydantic v2 models that validate the requests (``DeliverySpec`` is the SDK's own).
``create_app(settings)`` builds it; ``serve`` runs it until told to stop.
"""

from __future__ import annotations

from api.app import create_app
from api.server import serve

__all__ = ["create_app", "serve"]
