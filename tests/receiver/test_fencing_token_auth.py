"""The fencing token is authenticated by the same secret as the body, and a malformed one
is a 400 (never a 500), on both adapters.

The attack this closes: a captured request replayed with ``fencing-token: 2^63-1`` was
accepted as a duplicate and raised the key's token, so the genuine retry got 409 stale.
"""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import httpx
import pytest

from receiver import SqliteStore
from tests.receiver.conftest import Serve
from tests.receiver.support import (
    SECRET_A,
    UNKNOWN_SECRET,
    CountingHandler,
    body_of,
    kit,
    signed_headers,
)

MAX = 2**63 - 1


async def test_a_replayed_request_cannot_raise_the_token(serve: Serve, tmp_path: Path) -> None:
    handler = CountingHandler()
    body = body_of({"order": 1})
    async with serve(kit(handler, SqliteStore(tmp_path / "r.db"))) as url, httpx.AsyncClient() as c:
        genuine = signed_headers("k1", body, SECRET_A, fencing_token=3)
        first = await c.post(f"{url}/hooks", content=body, headers=genuine)
        # The captured request, its token raised: without, or with the old, token signature.
        replayed = [
            {**genuine, "fencing-token": str(MAX)},
            {k: v for k, v in genuine.items() if k != "fencing-token-signature"}
            | {"fencing-token": str(MAX)},
            signed_headers("k1", body, SECRET_A, fencing_token=MAX, sign_token=False),
            # The token signed by a secret the receiver does not hold.
            signed_headers("k1", body, SECRET_A, fencing_token=MAX)
            | {
                "fencing-token-signature": signed_headers(
                    "k1", body, UNKNOWN_SECRET, fencing_token=MAX
                )["fencing-token-signature"]
            },
        ]
        forged = [await c.post(f"{url}/hooks", content=body, headers=h) for h in replayed]
        retry = await c.post(
            f"{url}/hooks",
            content=body,
            headers=signed_headers("k1", body, SECRET_A, fencing_token=4),
        )
    assert first.status_code == 200
    for answer in forged:
        assert answer.status_code == 401, answer.text
        assert answer.json()["error"] == "invalid fencing token signature"
    assert (retry.status_code, retry.json()) == (
        200,
        {"id": "order-k1-1", "webhook_id": "k1", "duplicate": True},
    )
    assert handler.runs == Counter({"k1": 1})


@pytest.mark.parametrize(
    "token",
    ["²", "1" * 20, "9" * 5000, str(MAX + 1), "-1", "0x10", "٣"],
    ids=["superscript", "20-digits", "5000-digits", "2^63", "negative", "hex", "arabic-digit"],
)
async def test_a_malformed_token_is_400(serve: Serve, tmp_path: Path, token: str) -> None:
    handler = CountingHandler()
    body = body_of({"order": 1})
    headers = signed_headers("k1", body, SECRET_A, fencing_token=1) | {"fencing-token": token}
    async with serve(kit(handler, SqliteStore(tmp_path / "r.db"))) as url, httpx.AsyncClient() as c:
        # As bytes: a header value outside ASCII is sent as its UTF-8, as an attacker would.
        raw = [(name.encode(), value.encode()) for name, value in headers.items()]
        answer = await c.post(f"{url}/hooks", content=body, headers=raw)
    assert answer.status_code == 400, answer.text
    assert "fencing-token must be" in answer.json()["error"]
    assert not handler.runs
