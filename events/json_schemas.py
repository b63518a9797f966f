"""JSON Schemas of the events, from the pydantic models: the contract for producers and
consumers written in other languages (``ledger schema`` writes them).

One schema per event type at the version this library writes, named
``TYPE.vVERSION.schema.json`` (JSON Schema 2020-12, validation mode: what a reader here
accepts), plus ``index.json`` listing them with their topic. A schema says the shape; the
rules across fields stay in the library (the idempotency key and the payload hash derived
from the other fields, the payload hash under the scheme it names: README, Payload hashes).
Older versions of a type are upcast on read (events/upcasting.py) and have no schema here.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any, get_args

from events.base import Event
from events.budgets import AnyBudgetEvent
from events.endpoints import AnyEndpointEvent
from events.model import AnyDeliveryEvent, AnyExecutionEvent

DIALECT = "https://json-schema.org/draft/2020-12/schema"
INDEX = "index.json"
ID_PREFIX = "urn:delivery-ledger:event:"

# Each family of events, the topic (setting) its records are on, and its types.
FAMILIES: tuple[tuple[str, str, Any], ...] = (
    ("execution", "kafka.topic_runs", AnyExecutionEvent),
    ("delivery", "kafka.topic_deliveries", AnyDeliveryEvent),
    ("endpoint", "kafka.topic_endpoints", AnyEndpointEvent),
    ("budget", "kafka.topic_budgets", AnyBudgetEvent),
)


@dataclass(frozen=True)
class EventSchema:
    """One event type's schema at its current version, and where its records are."""

    event_type: str
    version: int
    family: str
    topic_setting: str
    schema: dict[str, Any]

    @property
    def filename(self) -> str:
        """``TYPE.vVERSION.schema.json``."""
        return f"{self.event_type}.v{self.version}.schema.json"


def _classes(union: Any) -> list[type[Event]]:
    """The event classes of a union (an ``Annotated`` discriminated one too)."""
    args = get_args(union)
    if args and not isinstance(args[0], type):  # Annotated[Union[...], Field(...)]
        args = get_args(args[0])
    return [cls for cls in args if isinstance(cls, type) and issubclass(cls, Event)]


def event_schemas() -> list[EventSchema]:
    """Every event type's schema, in family order then by type."""
    found = []
    for family, topic, union in FAMILIES:
        for cls in sorted(_classes(union), key=lambda c: c.TYPE):
            found.append(EventSchema(cls.TYPE, cls.SCHEMA_VERSION, family, topic, schema_of(cls)))
    return found


def schema_of(cls: type[Event]) -> dict[str, Any]:
    """The JSON Schema of one event class at its version.

    ``type`` and ``schema_version`` are required and constant: every record carries them,
    and a reader dispatches on them before anything else."""
    schema = cls.model_json_schema(mode="validation")
    properties = schema["properties"]
    properties["schema_version"] = {
        "const": cls.SCHEMA_VERSION,
        "type": "integer",
        "description": "The version of this type's fields; older ones are upcast on read.",
    }
    required = [name for name in ("type", "schema_version") if name not in schema["required"]]
    schema["required"] = required + schema["required"]
    return {
        "$schema": DIALECT,
        "$id": f"{ID_PREFIX}{cls.TYPE}:v{cls.SCHEMA_VERSION}",
        **schema,
    }


def index(schemas: list[EventSchema]) -> dict[str, Any]:
    """What ``index.json`` says: each type, its version, its topic and its file."""
    return {
        "description": (
            "JSON Schemas of the delivery-ledger events (ledger schema). A record's 'type' "
            "and 'schema_version' name its schema; see README, Event schemas."
        ),
        "dialect": DIALECT,
        "events": [
            {
                "type": s.event_type,
                "schema_version": s.version,
                "family": s.family,
                "topic_setting": s.topic_setting,
                "file": s.filename,
                "$id": s.schema["$id"],
            }
            for s in schemas
        ],
    }


def rendered(schemas: list[EventSchema]) -> dict[str, str]:
    """Each file's name and text: the schemas and the index, stable byte for byte."""
    files = {s.filename: _text(s.schema) for s in schemas}
    files[INDEX] = _text(index(schemas))
    return files


def write_schemas(out: Path) -> list[Path]:
    """Write every schema and the index into ``out`` (created if missing); the paths."""
    out.mkdir(parents=True, exist_ok=True)
    written = []
    for name, text in rendered(event_schemas()).items():
        path = out / name
        path.write_text(text, encoding="utf-8")
        written.append(path)
    return written


def _text(value: dict[str, Any]) -> str:
    return json.dumps(value, indent=2, ensure_ascii=False) + "\n"
