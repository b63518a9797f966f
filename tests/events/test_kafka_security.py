"""Kafka security settings that cannot work are refused before any connection, in one
line naming the ``LEDGER_`` variables, never echoing a secret."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from pydantic import ValidationError

from config.settings import Settings

SECRET = "s3cret-password-never-shown"


@pytest.mark.parametrize(
    ("given", "said"),
    [
        ({"security_protocol": "SASL_SSL"}, "LEDGER_KAFKA__SECURITY_PROTOCOL=SASL_SSL needs "
         "LEDGER_KAFKA__SASL_USERNAME and LEDGER_KAFKA__SASL_PASSWORD"),
        ({"security_protocol": "SASL_PLAINTEXT", "sasl_password": SECRET},
         "needs LEDGER_KAFKA__SASL_USERNAME and LEDGER_KAFKA__SASL_PASSWORD"),
        ({"sasl_username": "agent", "sasl_password": SECRET},
         "LEDGER_KAFKA__SECURITY_PROTOCOL=PLAINTEXT sends no credentials"),
        ({"security_protocol": "SSL", "ssl_cafile": "/nonexistent/ca.pem"},
         "LEDGER_KAFKA__SSL_CAFILE=/nonexistent/ca.pem: no such file"),
        ({"ssl_cafile": "/etc/hostname"}, "LEDGER_KAFKA__SSL_CAFILE is set but "
         "LEDGER_KAFKA__SECURITY_PROTOCOL=PLAINTEXT does not use TLS"),
        ({"security_protocol": "SSL", "ssl_keyfile": "/etc/hostname"},
         "LEDGER_KAFKA__SSL_KEYFILE is set without LEDGER_KAFKA__SSL_CERTFILE"),
    ],
)  # fmt: skip
def test_settings_that_cannot_work_are_refused_naming_the_variables(
    given: dict[str, object], said: str
) -> None:
    with pytest.raises(ValidationError) as caught:
        Settings(kafka=given)
    assert said in str(caught.value)
    assert SECRET not in str(caught.value)


def test_an_unknown_sasl_mechanism_is_refused() -> None:
    with pytest.raises(ValidationError, match="sasl_mechanism"):
        Settings(kafka={"sasl_mechanism": "GSSAPI"})


def run(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    keys = ("LEDGER_SIGNING__SIGNING_KEY", "LEDGER_SIGNING__VERIFY_KEYS")  # signing is on
    full = {k: v for k, v in os.environ.items() if not k.startswith("LEDGER_") or k in keys}
    # Nothing listens on port 1: a command that connected would say so instead.
    full.update({"LEDGER_KAFKA__BOOTSTRAP_SERVERS": "127.0.0.1:1", **env})
    return subprocess.run(
        [sys.executable, "-m", "ledger", *args],
        env=full,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


@pytest.mark.parametrize(
    ("env", "said"),
    [
        ({"LEDGER_KAFKA__SECURITY_PROTOCOL": "SASL_SSL", "LEDGER_KAFKA__SASL_PASSWORD": SECRET},
         "needs LEDGER_KAFKA__SASL_USERNAME and LEDGER_KAFKA__SASL_PASSWORD"),
        ({"LEDGER_KAFKA__SECURITY_PROTOCOL": "SSL",
          "LEDGER_KAFKA__SSL_CAFILE": "/nonexistent/ca.pem"},
         "LEDGER_KAFKA__SSL_CAFILE=/nonexistent/ca.pem: no such file"),
        ({"LEDGER_KAFKA__SECURITY_PROTOCOL": "SSL", "LEDGER_KAFKA__SSL_CAFILE": "NOT-PEM"},
         "the TLS files cannot be loaded (LEDGER_KAFKA__SSL_CAFILE)"),
    ],
)  # fmt: skip
def test_the_cli_says_so_in_one_line_before_connecting(
    env: dict[str, str], said: str, tmp_path: Path
) -> None:
    if env.get("LEDGER_KAFKA__SSL_CAFILE") == "NOT-PEM":
        garbage = tmp_path / "ca.pem"
        garbage.write_text("this is not a certificate\n")
        env = {**env, "LEDGER_KAFKA__SSL_CAFILE": str(garbage)}
    for args in (("topics", "create"), ("replay",), ("worker",)):
        done = run({**env, "LEDGER_DATA_DIR": str(tmp_path)}, *args)
        assert done.returncode != 0
        assert "Traceback" not in done.stderr, done.stderr
        lines = [line for line in done.stderr.splitlines() if line.strip()]
        assert said in lines[0], done.stderr
        assert len(lines) == 2, done.stderr
        assert "no Kafka broker answers" not in done.stderr  # refused before connecting
        assert SECRET not in done.stdout + done.stderr
