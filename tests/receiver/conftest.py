"""Idempotency stores for the contract suite: SQLite files and fresh PostgreSQL databases.

``store_factory`` hands out several stores over one database, as several receiver
processes would share it.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from pathlib import Path

import pytest

from receiver import WebhookReceiver
from receiver.postgres import PostgresStore
from receiver.sqlite import SqliteStore
from receiver.store import IdempotencyStore
from tests.receiver.support import UvicornServer, aiohttp_server

StoreFactory = Callable[[], IdempotencyStore]


@pytest.fixture(params=["sqlite", "postgres"])
async def store_factory(
    request: pytest.FixtureRequest, tmp_path: Path
) -> AsyncIterator[StoreFactory]:
    """Make stores over one fresh database of this case's backend; closed after the test."""
    if request.param == "postgres":
        dsn = request.getfixturevalue("postgres_factory")()

        def make_store() -> IdempotencyStore:
            return PostgresStore(dsn)
    else:
        path = tmp_path / "receiver.sqlite3"

        def make_store() -> IdempotencyStore:
            return SqliteStore(path)

    made: list[IdempotencyStore] = []

    def make() -> IdempotencyStore:
        store = make_store()
        made.append(store)
        return store

    yield make
    for store in made:
        await store.close()


@pytest.fixture
async def store(store_factory: StoreFactory) -> IdempotencyStore:
    """One started store."""
    made = store_factory()
    await made.start()
    return made


Serve = Callable[[WebhookReceiver], AbstractAsyncContextManager[str]]


@asynccontextmanager
async def uvicorn_server(receiver: WebhookReceiver) -> AsyncIterator[str]:
    with UvicornServer(receiver) as server:
        yield server.url


@asynccontextmanager
async def aiohttp_started(receiver: WebhookReceiver) -> AsyncIterator[str]:
    async with aiohttp_server(receiver) as url:
        yield url


@pytest.fixture(params=["aiohttp", "asgi"])
def serve(request: pytest.FixtureRequest) -> Serve:
    """Serve a receiver with the adapter of this case."""
    return aiohttp_started if request.param == "aiohttp" else uvicorn_server
