"""The events' JSON Schemas (events/json_schemas.py): one per type at its version, valid
JSON Schema, in step with what the decoder accepts. Broker-free; the records of a real log
are checked in tests/ledger/test_schema_export.py."""

from __future__ import annotations

import json
from typing import Any

import pytest
from jsonschema import Draft202012Validator
from jsonschema.exceptions import ValidationError
from pydantic import ValidationError as ModelError

from events.budgets import BUDGET_ADAPTER
from events.codec import encode
from events.delivery import DuplicateDeliveryRequest, new_delivery_requested
from events.endpoints import ENDPOINT_EVENT
from events.json_schemas import INDEX, EventSchema, event_schemas, rendered
from events.model import ALL_EVENT_TYPES, EVENT_ADAPTER
from tests.readme import readme_block

SCHEMAS = {s.event_type: s for s in event_schemas()}


def _validator(schema: EventSchema) -> Draft202012Validator:
    return Draft202012Validator(schema.schema, format_checker=Draft202012Validator.FORMAT_CHECKER)


def _types(adapter: Any) -> set[str]:
    schema = adapter.json_schema()
    return set(schema["discriminator"]["mapping"])


def test_every_event_type_has_one_schema_at_its_version() -> None:
    every = set(ALL_EVENT_TYPES) | _types(ENDPOINT_EVENT) | _types(BUDGET_ADAPTER)
    assert set(SCHEMAS) == every
    assert len(event_schemas()) == len(every)
    for name, cls in ALL_EVENT_TYPES.items():
        assert SCHEMAS[name].version == cls.SCHEMA_VERSION
    assert SCHEMAS["delivery.requested"].filename == "delivery.requested.v3.schema.json"


@pytest.mark.parametrize("name", sorted(SCHEMAS))
def test_each_schema_is_valid_json_schema_naming_its_type_and_version(name: str) -> None:
    schema = SCHEMAS[name].schema
    Draft202012Validator.check_schema(schema)
    assert schema["$schema"] == "https://json-schema.org/draft/2020-12/schema"
    assert schema["properties"]["type"]["const"] == name
    assert schema["properties"]["schema_version"]["const"] == SCHEMAS[name].version
    assert {"type", "schema_version"} <= set(schema["required"])
    assert schema["additionalProperties"] is False


def test_a_written_event_validates_and_a_bent_one_does_not() -> None:
    request = new_delivery_requested(
        run_id="run-1",
        event_type="run.succeeded",
        channel="webhook",
        recipient="https://example.test/hook",
        payload={"amount": 1.5, "tags": ["a"], "nested": {"ok": True}},
        slo_seconds=60,
        producer="agent-7",
    )
    record = json.loads(encode(request))
    validator = _validator(SCHEMAS["delivery.requested"])
    validator.validate(record)
    for bent in (
        {**record, "schema_version": 2},
        {**record, "payload_hash": "md5:" + "0" * 32},
        {**record, "surprise": 1},
        {k: v for k, v in record.items() if k != "type"},
        {**record, "event_id": "not-a-uuid"},
    ):
        with pytest.raises(ValidationError):
            validator.validate(bent)
        with pytest.raises(ModelError):  # and the decoder refuses it too
            EVENT_ADAPTER.validate_python(bent)


def test_a_duplicate_report_of_either_hash_scheme_validates() -> None:
    validator = _validator(SCHEMAS["delivery.duplicate_requested"])
    for original in ("a" * 64, "jcs-sha256:" + "b" * 64):
        report = DuplicateDeliveryRequest(
            idempotency_key="c" * 64,
            run_id="run-1",
            producer="worker",
            duplicate_event_id="7b0c5a52-1f7e-4c51-9a8e-0d7f3c2b9e11",
            payload_hash="jcs-sha256:" + "d" * 64,
            original_payload_hash=original,
            outcome="conflict",
        )
        validator.validate(json.loads(encode(report)))


def test_the_index_lists_every_file_with_its_topic() -> None:
    files = rendered(event_schemas())
    index = json.loads(files[INDEX])
    listed = {entry["file"] for entry in index["events"]}
    assert listed == set(files) - {INDEX}
    topics = {entry["type"]: entry["topic_setting"] for entry in index["events"]}
    assert topics["run.succeeded"] == "kafka.topic_runs"
    assert topics["delivery.requested"] == "kafka.topic_deliveries"
    assert topics["endpoint.registered"] == "kafka.topic_endpoints"
    assert topics["budget.spent"] == "kafka.topic_budgets"
    # Stable byte for byte: a second run writes the same files.
    assert rendered(event_schemas()) == files


def test_the_readme_example_runs() -> None:
    exec(readme_block("schema-example"), {})  # the README's own example
