"""A webhook secret shorter than 24 bytes (Standard Webhooks recommends 24 to 64) is
refused by the kit in one line naming which secret, never repeating it."""

from __future__ import annotations

import base64
from pathlib import Path

import pytest

from receiver import SqliteStore, WebhookReceiver
from tests.receiver.support import SECRET_A, CountingHandler


def whsec(raw: bytes) -> str:
    return "whsec_" + base64.b64encode(raw).decode()


@pytest.mark.parametrize("size", [1, 16, 23])
def test_the_kit_refuses_a_short_secret(tmp_path: Path, size: int) -> None:
    short = whsec(b"Q" * size)
    with pytest.raises(ValueError, match=rf"^webhook secret #2 is {size} bytes; at least 24") as e:
        WebhookReceiver(
            CountingHandler(), secrets=[SECRET_A, short], store=SqliteStore(tmp_path / "r.db")
        )
    assert "\n" not in str(e.value)
    assert short.removeprefix("whsec_") not in str(e.value)


def test_the_kit_takes_24_bytes(tmp_path: Path) -> None:
    WebhookReceiver(
        CountingHandler(), secrets=[whsec(b"Q" * 24)], store=SqliteStore(tmp_path / "r.db")
    )
