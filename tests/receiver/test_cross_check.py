"""An outside client: requests signed by the official ``standardwebhooks`` library, not by
the ledger's signer, sent to a kit receiver served by aiohttp on 127.0.0.1."""

from __future__ import annotations

import time
from collections import Counter
from pathlib import Path

import httpx

from receiver import SqliteStore
from tests.receiver.support import (
    SECRET_A,
    SECRET_B,
    UNKNOWN_SECRET,
    CountingHandler,
    aiohttp_server,
    body_of,
    kit,
    signed_headers,
)


async def test_the_kit_accepts_what_the_official_library_signs_and_rejects_the_rest(
    tmp_path: Path,
) -> None:
    handler = CountingHandler()
    # Mid-rotation: the receiver holds the old and the new secret.
    receiver = kit(handler, SqliteStore(tmp_path / "r.db"), secrets=[SECRET_A, SECRET_B])
    body = body_of({"text": "run finished", "emoji": "\u2705"})
    now = int(time.time())
    async with aiohttp_server(receiver) as url, httpx.AsyncClient() as c:

        async def post(key: str, headers: dict[str, str], content: bytes = body) -> httpx.Response:
            return await c.post(f"{url}/hooks", content=content, headers=headers)

        old_only = await post("k-old", signed_headers("k-old", body, SECRET_A))
        new_only = await post("k-new", signed_headers("k-new", body, SECRET_B))
        unknown_and_new = await post(
            "k-both", signed_headers("k-both", body, UNKNOWN_SECRET, SECRET_B)
        )
        tampered = await post(
            "k-t", signed_headers("k-t", body, SECRET_A), body_of({"text": "run failed"})
        )
        stale = await post("k-s", signed_headers("k-s", body, SECRET_A, timestamp=now - 330))
        future = await post("k-f", signed_headers("k-f", body, SECRET_A, timestamp=now + 330))
        unknown = await post("k-u", signed_headers("k-u", body, UNKNOWN_SECRET))
        other_id = await post("k-x", signed_headers("k-y", body, SECRET_A) | {"webhook-id": "k-x"})
        no_comma = await post(
            "k-m", signed_headers("k-m", body, SECRET_A) | {"webhook-signature": "v1"}
        )
        not_base64 = await post(
            "k-m", signed_headers("k-m", body, SECRET_A) | {"webhook-signature": "v1,%%%"}
        )
        garbled = signed_headers("k-g", body, SECRET_A)
        beside_garbled = await post(
            "k-g", garbled | {"webhook-signature": f"v1,%%% {garbled['webhook-signature']}"}
        )
    for accepted in (old_only, new_only, unknown_and_new, beside_garbled):
        assert accepted.status_code == 200, accepted.text
    assert handler.runs == Counter({"k-old": 1, "k-new": 1, "k-both": 1, "k-g": 1})
    assert handler.seen[0].payload == {"text": "run finished", "emoji": "\u2705"}
    for rejected in (tampered, unknown, other_id):
        assert rejected.status_code == 401
        assert rejected.json()["detail"] == "no v1 signature matches any of the receiver's secrets"
    for malformed in (no_comma, not_base64):
        assert malformed.status_code == 401
        assert malformed.json()["detail"].startswith("webhook-signature is malformed")
    for late in (stale, future):
        assert late.status_code == 401
        assert "outside the 300s tolerance (check the sender's clock)" in late.json()["detail"]


async def test_a_narrower_tolerance_refuses_what_the_library_would_still_allow(
    tmp_path: Path,
) -> None:
    handler = CountingHandler()
    receiver = kit(handler, SqliteStore(tmp_path / "r.db"), tolerance_s=30)
    body = body_of({"n": 1})
    async with aiohttp_server(receiver) as url, httpx.AsyncClient() as c:
        headers = signed_headers("k1", body, SECRET_A, timestamp=int(time.time()) - 60)
        answer = await c.post(f"{url}/hooks", content=body, headers=headers)
    assert answer.status_code == 401
    assert "outside the 30s tolerance" in answer.json()["detail"]
    assert handler.runs == Counter()
