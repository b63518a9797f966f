"""Lookups are authenticated: the worker signs them with the endpoint's secret (the lookup
contract in README), the kit answers only a signed, fresh lookup, on both adapters."""

from __future__ import annotations

import time
from pathlib import Path

import httpx

from receiver import SqliteStore
from tests.receiver.conftest import Serve
from tests.receiver.support import (
    SECRET_A,
    SECRET_B,
    UNKNOWN_SECRET,
    CountingHandler,
    body_of,
    kit,
    signed_headers,
    signed_lookup,
)


async def test_only_a_signed_fresh_lookup_is_answered(serve: Serve, tmp_path: Path) -> None:
    handler = CountingHandler()
    body = body_of({"order": 7})
    receiver = kit(handler, SqliteStore(tmp_path / "r.db"), secrets=[SECRET_B, SECRET_A])
    async with serve(receiver) as url, httpx.AsyncClient() as c:
        posted = await c.post(
            f"{url}/hooks", content=body, headers=signed_headers("k7", body, SECRET_A)
        )
        lookup = f"{url}/hooks/lookup/k7"
        unsigned = await c.get(lookup)
        forged = await c.get(lookup, headers=signed_lookup("k7", UNKNOWN_SECRET))
        other_key = await c.get(lookup, headers=signed_lookup("k8", SECRET_A))
        stale = await c.get(
            lookup, headers=signed_lookup("k7", SECRET_A, timestamp=int(time.time()) - 600)
        )
        signed = await c.get(lookup, headers=signed_lookup("k7", SECRET_A))
        never_sent = await c.get(
            f"{url}/hooks/lookup/never-sent", headers=signed_lookup("never-sent", SECRET_A)
        )
    assert posted.status_code == 200
    for refused in (unsigned, forged, other_key, stale):
        assert refused.status_code == 401, refused.text
        assert refused.json()["error"] == "invalid lookup signature"
        assert "order-k7" not in refused.text
    assert "missing lookup-timestamp or lookup-signature" in unsigned.json()["detail"]
    assert "outside the 300s tolerance" in stale.json()["detail"]
    assert SECRET_A.removeprefix("whsec_") not in forged.text
    assert (signed.status_code, signed.json()) == (
        200,
        {"status": "done", "id": "order-k7-1", "webhook_id": "k7"},
    )
    assert never_sent.status_code == 404
