"""The worker's batching settings reach its producers and its faust app (issue 12, part 6).

``LEDGER_WORKER__LINGER_S`` is how long the worker's producers wait for company before a
batch leaves; ``LEDGER_WORKER__STANDBY_REPLICAS`` is faust's warm table copies. Takeover
without a standby (the default) is exercised by the failure matrix and continuity tests,
where a worker joins or is SIGKILLed and the survivor rebuilds the table from the changelog.
"""

from __future__ import annotations

import time

import pytest

from clients.aiokafka_internals import fetch_options
from config.settings import Settings, changed
from streams.app import create_app
from streams.faust_internals import new_worker_consumer
from streams.outcome_producer import OutcomeProducer
from tests.fixtures.core import requested


async def timed_append(settings: Settings) -> float:
    outcomes = OutcomeProducer(settings)
    try:
        await outcomes.append([requested(0)])  # connects; not timed
        began = time.monotonic()
        await outcomes.append([requested(1)])
        return time.monotonic() - began
    finally:
        await outcomes.stop()


async def test_outcome_appends_wait_for_the_configured_linger(settings: Settings) -> None:
    """A lone append is acknowledged no sooner than the linger lets its batch leave."""
    lingering = changed(settings, {"worker.linger_s": 0.6})
    assert await timed_append(lingering) >= 0.5


async def test_no_linger_sends_at_once(settings: Settings) -> None:
    eager = changed(settings, {"worker.linger_s": 0.0})
    assert await timed_append(eager) < 0.5


@pytest.mark.parametrize(("linger_ms", "standby"), [(20.0, 0), (0.0, 1)])
def test_faust_app_gets_linger_and_standby(
    tmp_path: object, linger_ms: float, standby: int
) -> None:
    settings = Settings(
        worker={"linger_s": linger_ms / 1000, "standby_replicas": standby},
        channels={"webhook_secret": "whsec_" + "A" * 32},
        data_dir=tmp_path,
    )
    worker = create_app(settings, "batching")
    assert worker.app.conf.producer_linger == pytest.approx(linger_ms / 1000)
    assert worker.app.conf.table_standby_replicas == standby


@pytest.mark.parametrize(
    ("wait_ms", "min_bytes", "max_wait_ms"), [(0.0, 1, 1500), (25.0, 65536, 25)]
)
async def test_the_worker_consumer_gets_the_fetch_wait(
    tmp_path: object, wait_ms: float, min_bytes: int, max_wait_ms: int
) -> None:
    """``LEDGER_WORKER__FETCH_WAIT_S`` reaches the aiokafka consumer faust builds for the
    agent (0 keeps faust's: answered at the first byte, 1.5 s at most)."""
    settings = Settings(
        worker={"fetch_wait_s": wait_ms / 1000},
        channels={"webhook_secret": "whsec_" + "A" * 32},
        data_dir=tmp_path,
    )
    worker = create_app(settings, "fetching")
    consumer = new_worker_consumer(worker.app)  # as faust builds it, in its own thread
    assert fetch_options(consumer) == ("read_committed", min_bytes, max_wait_ms)
    await consumer.stop()  # never started; closed, so no warning at collection
