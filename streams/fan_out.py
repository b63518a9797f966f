"""The worker's fan-out: a run record's deliveries to ``ledger.deliveries``.

A ``RunSucceeded`` written in the publisher's record mode carries its deliveries; the
worker that owns the run's partition writes each as an ordinary ``DeliveryRequested``
(events/fan_out.py derives every byte from the run), then the offset is committed past the
run. At least once: a worker that dies mid fan-out leaves the run to its successor, whose
requests are the same events again, which the fold (by ``event_id``) and the projections
ignore.

Who refuses what (docs/ARCHITECTURE.md, who dead-letters what): a run record that does not
decode is the live projector's to dead-letter (it owns ``ledger.runs``); the fan-out skips
and counts it. An entry no valid request can be made of, or whose request would pass the
record limit, is only the fan-out's to see: it sends ONE dead letter per run record naming
every such entry, with the run record's bytes and position, and fans out the rest, as the
worker refuses one bad ``DeliveryRequested`` record of a transaction and folds the others.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable

from clients.record_size import MAX_RECORD_BYTES, record_size
from clients.tracing import TRACEPARENT
from events.codec import EventDecodeError, decode, encode
from events.execution import RunSucceeded
from events.fan_out import EntryRefused, fan_out
from events.faults import crash_if_enabled
from events.refusal import Refuser, refusal
from events.topics import record_key
from streams.processor import DeadLetterSink, Record

# A fault point of the failure tests: SIGKILL after a run's first request was written (and
# flushed), before the rest and before the run's offset is committed.
MID_FAN_OUT = "worker.mid_fan_out"
# A dead letter's reason names at most this many refused entries.
NAMED_ENTRIES = 5

Headers = list[tuple[str, bytes]]
SendRequest = Callable[[bytes, bytes, Headers | None], Awaitable[None]]


class RunFanOut:
    """Fans out the run records of the partitions this worker owns."""

    def __init__(
        self,
        *,
        send: SendRequest,
        flush: Callable[[], Awaitable[None]],
        dead_letter: DeadLetterSink,
        worker_id: str,
        faults: frozenset[str] = frozenset(),
    ) -> None:
        """``send`` writes one request (key, value, headers) to the deliveries topic;
        ``flush`` waits until what was sent is written."""
        self._send = send
        self._flush = flush
        self._dead_letter = dead_letter
        self._worker_id = worker_id
        self._faults = faults
        self.runs = 0
        self.requests = 0
        self.skipped = 0
        self.refused = 0

    async def handle(self, record: Record) -> None:
        """Fan out one record of ``ledger.runs`` (most carry no deliveries: nothing to do)."""
        try:
            run = decode(record.value)
        except EventDecodeError:
            self.skipped += 1  # the projector's to dead-letter
            return
        if not isinstance(run, RunSucceeded) or not run.deliveries:
            return
        if record.key is not None and record.key != record_key(run):
            self.skipped += 1  # the projector's to dead-letter, for the same reason
            return
        headers: Headers | None = [
            (name, value) for name, value in record.headers if name == TRACEPARENT
        ] or None
        try:
            planned = self._plan(run, headers)
        except Exception as exc:  # noqa: BLE001 - the record guard: any pure failure
            where = (record.topic, record.partition, record.offset)
            await self._refuse(
                record, refusal(Refuser.WORKER, *where, exc, instance=self._worker_id)
            )
            return
        refused = [item for item in planned if isinstance(item, EntryRefused)]
        written = 0
        for item in planned:
            if isinstance(item, EntryRefused):
                continue
            await self._send(*item, headers)
            written += 1
            if written == 1 and MID_FAN_OUT in self._faults and len(planned) > 1:
                await self._flush()
                crash_if_enabled(MID_FAN_OUT, self._faults)
        self.runs += 1
        self.requests += written
        if refused:
            named = "; ".join(
                f"delivery {r.index} of {len(planned)}: {r.reason}" for r in refused[:NAMED_ENTRIES]
            )
            more = len(refused) - NAMED_ENTRIES
            named += f" (+{more} more)" if more > 0 else ""
            by = f"{Refuser.WORKER.value} {self._worker_id}"
            at = f"{record.topic}[{record.partition}]@{record.offset}"
            await self._refuse(record, f"{by} refused {at}: {named}")

    def _plan(
        self, run: RunSucceeded, headers: Headers | None
    ) -> list[tuple[bytes, bytes] | EntryRefused]:
        """Each entry's (key, value), or why it is refused (pure)."""
        planned: list[tuple[bytes, bytes] | EntryRefused] = []
        for index, item in enumerate(fan_out(run), start=1):
            if isinstance(item, EntryRefused):
                planned.append(item)
                continue
            key, value = record_key(item), encode(item)
            if (size := record_size(key, value, headers)) > MAX_RECORD_BYTES:
                reason = f"its request would be a {size}-byte record, over the limit of "
                planned.append(EntryRefused(index, reason + str(MAX_RECORD_BYTES)))
                continue
            planned.append((key, value))
        return planned

    async def _refuse(self, record: Record, reason: str) -> None:
        self.refused += 1
        await self._dead_letter(record, reason)
