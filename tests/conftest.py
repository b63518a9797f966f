import os

from tests.fixtures.secrets import TEST_WEBHOOK_SECRET

# No built-in signing secret exists: the tests configure theirs, as a user would.
os.environ.setdefault("LEDGER_WEBHOOK_SECRET", TEST_WEBHOOK_SECRET)

pytest_plugins = [
    "tests.fixtures.broker",
    "tests.fixtures.secure_broker",
    "tests.fixtures.postgres",
    "tests.fixtures.receiver",
    "tests.fixtures.slack",
    "tests.fixtures.mail",
    "tests.fixtures.email_api",
    "tests.fixtures.form",
    "tests.fixtures.worker",
    "tests.fixtures.projection",
    "tests.fixtures.core",
]
