"""``ledger worker`` without a usable signing secret: it refuses to start, in one line and a
hint, without a traceback and without repeating the secret; nothing is contacted first."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

# A secret the standardwebhooks library refuses (9 base64 characters), distinctive enough
# that finding it in the output would mean it was echoed.
REFUSED = "whsec_SeCrEtXyZ"
GOOD = "whsec_" + "Z29vZC1zZWNyZXQtZm9yLXRoZS1zdGFydC10ZXN0"
# Valid base64 of one byte, and of 23: below the 24 bytes Standard Webhooks recommends.
ONE_BYTE = "whsec_" + "aw=="
SHORT = "whsec_" + "U2VDckV0WHlaLXR3ZW50eS10aHJlZSE="


def start_worker(tmp_path: object, **env: str) -> subprocess.CompletedProcess[str]:
    keep = ("LEDGER_SIGNING__SIGNING_KEY", "LEDGER_SIGNING__VERIFY_KEYS")  # signing is on
    base = {k: v for k, v in os.environ.items() if not k.startswith("LEDGER_") or k in keep}
    base.update(
        {
            # Nothing listens there: a worker that got as far as connecting would hang.
            "LEDGER_KAFKA__BOOTSTRAP_SERVERS": "127.0.0.1:1",
            "LEDGER_DATA_DIR": str(tmp_path),
            **env,
        }
    )
    process = subprocess.Popen(
        [sys.executable, "-m", "ledger", "worker", "--name", "signing-start"],
        env=base,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        stdin=subprocess.DEVNULL,
        text=True,
    )
    try:
        out, err = process.communicate(timeout=60)
    finally:
        if process.poll() is None:
            process.kill()
            process.wait(timeout=10)
    return subprocess.CompletedProcess(process.args, process.returncode, out, err)


@pytest.mark.parametrize(
    ("env", "says"),
    [
        ({}, "no webhook signing secret: LEDGER_CHANNELS__WEBHOOK_SECRET is not set"),
        (
            {"LEDGER_CHANNELS__WEBHOOK_SECRET": REFUSED},
            "LEDGER_CHANNELS__WEBHOOK_SECRET: webhook secret is not",
        ),
        (
            {
                "LEDGER_CHANNELS__WEBHOOK_SECRET": GOOD,
                "LEDGER_CHANNELS__WEBHOOK_ENDPOINTS": json.dumps(
                    {"https://hooks.example.test/team": {"secret": REFUSED}}
                ),
            },
            "webhook endpoint 'https://hooks.example.test:443/team': webhook secret is not",
        ),
        (
            {
                "LEDGER_CHANNELS__WEBHOOK_ENDPOINTS": json.dumps(
                    {
                        "https://a.example.test/": {"secrets": [GOOD]},
                        "https://b.example.test/hooks": {},
                    }
                )
            },
            "LEDGER_CHANNELS__WEBHOOK_SECRET is not set and endpoint "
            "'https://b.example.test:443/hooks' has none of its own",
        ),
        (
            {"LEDGER_CHANNELS__WEBHOOK_SECRET": ONE_BYTE},
            "LEDGER_CHANNELS__WEBHOOK_SECRET: webhook secret is 1 bytes; at least 24 are required",
        ),
        (
            {
                "LEDGER_CHANNELS__WEBHOOK_SECRET": GOOD,
                "LEDGER_CHANNELS__WEBHOOK_ENDPOINTS": json.dumps(
                    {"https://hooks.example.test/team": {"secrets": [GOOD, SHORT]}}
                ),
            },
            "webhook endpoint 'https://hooks.example.test:443/team': webhook secret is 23 "
            "bytes; at least 24 are required",
        ),
    ],
    ids=[
        "no-secret",
        "refused-global",
        "refused-endpoint",
        "endpoint-without-secret",
        "one-byte-global",
        "short-endpoint",
    ],
)
def test_worker_refuses_to_start_in_one_line_and_a_hint(
    tmp_path: object, env: dict[str, str], says: str
) -> None:
    try:
        done = start_worker(tmp_path, **env)
    except subprocess.TimeoutExpired:
        pytest.fail("the worker did not refuse to start: it was still running after 60 s")
    output = done.stdout + done.stderr
    assert done.returncode != 0
    assert "Traceback" not in output
    lines = [line for line in done.stderr.splitlines() if line.strip()]
    assert len(lines) == 2, output
    assert lines[0].startswith("error: ")
    assert says in lines[0]
    assert lines[1].startswith("hint: ")
    assert "SeCrEtXyZ" not in output
    assert "U2VDckV0WHlaLXR3ZW50eS10aHJlZSE=" not in output
