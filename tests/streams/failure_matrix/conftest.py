"""The failure matrix's fixtures: the pool of stacks, and a webhook stack per test."""

from collections.abc import AsyncIterator, Iterator
from functools import partial

import pytest

from config.settings import Settings, changed
from tests.fixtures.broker import ReadTopic
from tests.streams.failure_matrix.drivers import WebhookDriver
from tests.streams.failure_matrix.stacks import Stack, StackPool


@pytest.fixture(scope="module")
def stack_pool(broker: Settings, tmp_path_factory: pytest.TempPathFactory) -> Iterator[StackPool]:
    """The module's stacks: the shared one kept while its rows run, each closed after use."""
    pool = StackPool(broker, tmp_path_factory)
    yield pool
    pool.close()


@pytest.fixture(params=[{"hooks": "plain"}, {"hooks": "kit"}], ids=["plain", "kit"])
async def webhook(
    request: pytest.FixtureRequest, stack_pool: StackPool, read_topic: ReadTopic
) -> AsyncIterator[Stack[WebhookDriver]]:
    """A stack of its own around the simulator's webhook receiver (no dedupe), plain or a
    receiver-kit app (the param: WebhookDriver fields, and ``mode``, the publisher's:
    ``record`` for the rows the record mode must pass too); no worker started."""
    config = dict(request.param)
    mode = config.pop("mode", "transaction")
    make = partial(WebhookDriver, **config)
    stack = await stack_pool.get(f"webhook-{config['hooks']}", make, read_topic, shared=False)
    stack.settings = changed(stack.settings, {"publisher.mode": mode})
    yield stack
    stack_pool.release()
