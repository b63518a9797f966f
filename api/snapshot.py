"""The OpenAPI document as committed for the TypeScript client (typescript/client/openapi.json).

``python -m api.snapshot > typescript/client/openapi.json`` writes it; the client's types are
generated from that file (openapi-typescript), and tests/typescript/test_openapi_snapshot.py
fails when the app's document and the committed one differ, so a change to the API is a
change to the client too.
"""

from __future__ import annotations

import json
import sys

from api.app import create_app
from config.settings import Settings

SNAPSHOT = "typescript/client/openapi.json"


def document() -> str:
    """The app's OpenAPI document as stable JSON text (sorted keys, two-space indent)."""
    return json.dumps(create_app(Settings()).openapi(), indent=2, sort_keys=True) + "\n"


if __name__ == "__main__":
    sys.stdout.write(document())
