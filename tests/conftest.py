import json
import os

from clients.outcome_signing import new_pair
from tests.fixtures.secrets import TEST_WEBHOOK_SECRET

# No built-in signing secret exists: the tests configure theirs, as a user would.
os.environ.setdefault("LEDGER_CHANNELS__WEBHOOK_SECRET", TEST_WEBHOOK_SECRET)
# Outcome signing is on by default: every worker and reader a test starts shares one pair,
# made for this test process (inherited by the processes it starts), as a user's would be.
if "LEDGER_SIGNING__SIGNING_KEY" not in os.environ:
    _signing, _verify = new_pair()
    os.environ["LEDGER_SIGNING__SIGNING_KEY"] = _signing
    os.environ["LEDGER_SIGNING__VERIFY_KEYS"] = json.dumps([_verify])
# And one operator pair: the tests that act as an operator sign with it.
if "LEDGER_SIGNING__OPERATOR_KEY" not in os.environ:
    _operator, _operator_verify = new_pair()
    os.environ["LEDGER_SIGNING__OPERATOR_KEY"] = _operator
    os.environ["LEDGER_SIGNING__OPERATOR_VERIFY_KEYS"] = json.dumps([_operator_verify])

pytest_plugins = [
    "tests.fixtures.broker",
    "tests.fixtures.secure_broker",
    "tests.fixtures.cluster",
    "tests.fixtures.postgres",
    "tests.fixtures.own_postgres",
    "tests.fixtures.receiver",
    "tests.fixtures.slack",
    "tests.fixtures.mail",
    "tests.fixtures.email_api",
    "tests.fixtures.form",
    "tests.fixtures.worker",
    "tests.fixtures.projection",
    "tests.fixtures.api",
    "tests.fixtures.core",
    "tests.fixtures.durations",
    "tests.fixtures.slow_first",
]
