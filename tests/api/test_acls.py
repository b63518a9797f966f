"""The ``api`` role's Kafka ACLs: an agent for its key holders, reading the keys."""

from __future__ import annotations

from api.services import TRANSACTIONAL_PREFIX
from config.settings import Settings, changed
from ledger.acls import API_TRANSACTIONAL_PREFIX, role_acls


def test_the_api_role_writes_runs_under_its_prefix_and_reads_the_keys() -> None:
    settings = Settings()
    shown = {acl.describe() for acl in role_acls(settings, "api", "User:api")}
    assert shown == {
        "User:api WRITE TOPIC ledger.runs",
        "User:api DESCRIBE TOPIC ledger.runs",
        "User:api WRITE TOPIC ledger.deliveries",
        "User:api DESCRIBE TOPIC ledger.deliveries",
        "User:api READ TOPIC ledger.api_keys",
        "User:api DESCRIBE TOPIC ledger.api_keys",
        "User:api WRITE TRANSACTIONAL_ID prefix ledger-api-",
        "User:api DESCRIBE TRANSACTIONAL_ID prefix ledger-api-",
    }
    # The prefix the role grants is the one the API's publisher uses.
    assert API_TRANSACTIONAL_PREFIX == TRANSACTIONAL_PREFIX
    # A configured transactional id is granted exactly.
    fixed = changed(settings, {"api.transactional_id": "api-eu-1"})
    assert "User:api WRITE TRANSACTIONAL_ID api-eu-1" in {
        acl.describe() for acl in role_acls(fixed, "api", "User:api")
    }
    # Operators issue and revoke keys.
    operator = {acl.describe() for acl in role_acls(settings, "operator", "User:op")}
    assert {"User:op WRITE TOPIC ledger.api_keys", "User:op READ TOPIC ledger.api_keys"} <= operator
