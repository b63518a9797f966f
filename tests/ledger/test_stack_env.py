"""A child process started with ``settings_env`` sees the same settings, secrets included
(``model_dump`` writes a SecretStr as asterisks: the child would sign with those)."""

from __future__ import annotations

import os
import subprocess
import sys

from pydantic import SecretStr

from config.settings import Settings, WebhookEndpoint
from ledger.stack import settings_env

GLOBAL = "whsec_Z2xvYmFsLXNlY3JldC1mb3ItdGhlLWNoaWxk"
OLD, NEW = "whsec_b2xkLWVuZHBvaW50LXNlY3JldA", "whsec_bmV3LWVuZHBvaW50LXNlY3JldA=="

PRINT_SECRETS = """
from config.settings import Settings
s = Settings()
secret = s.channels.webhook_secret
print(secret.get_secret_value() if secret else None)
for prefix, endpoint in s.channels.webhook_endpoints.items():
    print(prefix, *[x.get_secret_value() for x in endpoint.signing_secrets()], endpoint.lookup_url)
"""


def test_a_child_process_gets_every_secret_in_the_clear(tmp_path: object) -> None:
    settings = Settings(
        channels={
            "webhook_secret": SecretStr(GLOBAL),
            "webhook_endpoints": {
                "https://hooks.example.test/a": WebhookEndpoint(
                    secrets=[SecretStr(OLD), SecretStr(NEW)], lookup_url="https://l.example.test/"
                ),
                "https://hooks.example.test/b": WebhookEndpoint(secret=SecretStr(OLD)),
                "https://hooks.example.test/c": WebhookEndpoint(),
            },
        }
    )
    done = subprocess.run(
        [sys.executable, "-c", PRINT_SECRETS],
        env=settings_env(settings),
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    assert done.stdout.splitlines() == [
        GLOBAL,
        f"https://hooks.example.test/a {OLD} {NEW} https://l.example.test/",
        f"https://hooks.example.test/b {OLD} None",
        "https://hooks.example.test/c None",
    ]


def test_without_a_global_secret_the_child_has_none_either() -> None:
    env = settings_env(Settings(channels={"webhook_secret": None}))
    # tests/conftest.py sets one in this process: the child does not inherit it.
    assert "LEDGER_CHANNELS__WEBHOOK_SECRET" in os.environ
    assert "LEDGER_CHANNELS__WEBHOOK_SECRET" not in env
    assert not any(name.startswith("LEDGER_CHANNELS__WEBHOOK_SECRET") for name in env)
