"""Per-endpoint rate limit, measured (issue 27, item 3): several workers, one limited endpoint.

Four ``ledger worker`` processes in one group (8 partitions: two each, so each worker's
share is a quarter of the limit, streams/rate_gate.py) send a backlog of webhook deliveries
to one endpoint limited to 20/s (``rate_limit_per_s`` on the endpoint): with the default
burst, the claims gated and the sends paced (streams/send_pacer.py); the same with the
claims gated only (``LEDGER_CHANNELS__RATE_LIMIT_PACING=false``, as before pacing);
then paced with a burst of two tokens per worker. The receiver is
bench/verifying_receiver.py on 127.0.0.1, in its own process: it verifies every POST with
``standardwebhooks``, records each arrival's time and does not dedupe. Figures per round:
the most arrivals in any sliding 1 s window, the most claims (the moments a worker took a
token, their occurred_at on the broker's clock) in any 1 s window, the rate from first to
last arrival, keys that arrived twice or never. The baseline is the same round, in the
same invocation on the same broker and receiver, with fresh workers and no limit.

    python -m bench.rate_limit [--deliveries 400] [--limit 20] [--workers 4] [--rounds 2]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import shutil
import tempfile
import time
import uuid
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
from aiokafka import AIOKafkaConsumer, TopicPartition
from rich.console import Console

from bench import e2e, peer
from bench.common import BENCH_WEBHOOK_SECRET, bench_broker, fresh_settings, machine, stop_child
from clients import DeliverySpec, Publisher
from clients.kafka_security import client_options
from clients.outcome_signing import new_pair
from config import Settings
from config.settings import WebhookEndpoint, changed
from events.codec import EventDecodeError, decode
from events.delivery import DeliveryClaimed
from ledger.stack import Stack
from ledger.topics import create_topics

BROKER_PORT = 29792  # this benchmark's own broker (and the next port)
RECEIVER_PORT = 18792
METRICS_PORT = 18795  # and the next free ones: the workers' metrics
PER_RUN = 10  # deliveries per published run
PUBLISHERS = 4


def most_in_a_window(times: list[float], window_s: float = 1.0) -> int:
    """The most arrivals in any half-open window [t, t + window_s) (t at an arrival)."""
    times = sorted(times)
    most, first = 0, 0
    for last, at in enumerate(times):
        while at - times[first] >= window_s:
            first += 1
        most = max(most, last - first + 1)
    return most


async def arrivals_since(client: httpx.AsyncClient, base: str, since: int) -> list[list[Any]]:
    """Every arrival the receiver recorded from index ``since`` on: [key, unix time]."""
    answer = await client.get(f"{base}/_arrivals", params={"since": since})
    answer.raise_for_status()
    arrivals: list[list[Any]] = answer.json()["arrivals"]
    return arrivals


async def publish(settings: Settings, base: str, deliveries: int) -> list[str]:
    """``deliveries`` webhooks to the endpoint, as fast as the publishers go; their keys."""
    tag = uuid.uuid4().hex[:8]
    keys: list[str] = []
    async with contextlib.AsyncExitStack() as opened:
        publishers = [
            await opened.enter_async_context(Publisher(settings, producer_name=f"rate-agent-{j}"))
            for j in range(PUBLISHERS)
        ]

        async def agent(j: int, publisher: Publisher) -> None:
            for run in range(j, deliveries // PER_RUN, PUBLISHERS):
                specs = [
                    DeliverySpec(
                        channel="webhook",
                        recipient=f"{base}/hooks/r{run}-{n}",
                        payload={"run": run, "n": n},
                    )
                    for n in range(PER_RUN)
                ]
                requested = await publisher.run_succeeded(f"rate-{tag}-{run}", "h", specs)
                keys.extend(r.idempotency_key for r in requested)

        async with asyncio.TaskGroup() as group:
            for j, publisher in enumerate(publishers):
                group.create_task(agent(j, publisher))
    return keys


async def claim_times(settings: Settings, wanted: set[str]) -> list[float]:
    """When each claim of ``wanted`` was made (its occurred_at, the worker's broker clock):
    the moments the gate granted a token, before the trip through the log and the send."""
    consumer = AIOKafkaConsumer(
        bootstrap_servers=settings.kafka.bootstrap_servers,
        enable_auto_commit=False,
        **client_options(settings.kafka),
    )
    await consumer.start()
    try:
        topic = settings.kafka.topic_deliveries
        parts = [TopicPartition(topic, n) for n in range(settings.kafka.partitions)]
        consumer.assign(parts)
        await consumer.seek_to_beginning(*parts)
        ends = await consumer.end_offsets(parts)
        times: list[float] = []
        while any([await consumer.position(tp) < ends[tp] for tp in parts]):
            for messages in (await consumer.getmany(timeout_ms=500)).values():
                for message in messages:
                    try:
                        event = decode(message.value)
                    except EventDecodeError:
                        continue
                    if isinstance(event, DeliveryClaimed) and event.idempotency_key in wanted:
                        times.append(event.occurred_at.timestamp())
        return times
    finally:
        await consumer.stop()


async def counted(client: httpx.AsyncClient, ports: dict[str, int], name: str) -> float:
    """The counter ``name`` (ledger_worker_rate_limit_holds_total, say), summed over the
    workers."""
    total = 0.0
    for port in ports.values():
        with contextlib.suppress(httpx.HTTPError):
            text = (await client.get(f"http://127.0.0.1:{port}/metrics")).text
            total += sum(
                float(line.split()[1]) for line in text.splitlines() if line.startswith(f"{name} ")
            )
    return total


async def measure_system(
    label: str,
    configured: Settings,
    base: str,
    stack: Stack,
    client: httpx.AsyncClient,
    args: argparse.Namespace,
    console: Console,
) -> dict[str, Any]:
    """Fresh workers on fresh topics, a warm-up round (connections open, code paths hot;
    reported apart), then ``args.rounds`` rounds of a backlog each."""
    settings = fresh_settings(configured, f"rate-{label}")
    await create_topics(settings)
    ports: dict[str, int] = {}
    for i in range(1, args.workers + 1):
        ports[str(i)] = peer.free_port(max([METRICS_PORT - 1, *ports.values()]) + 1)
    children = [e2e.start_worker(stack, settings, f"{label}-{i}", ports) for i in ports]
    rounds = []
    try:
        await e2e.wait_owned(children, settings.kafka.partitions, ports=ports)
        sizes = [args.warmup] + [args.deliveries] * args.rounds
        for number, size in enumerate(sizes):
            since = len(await arrivals_since(client, base, 0))
            began = time.monotonic()
            keys = await publish(settings, base, size)
            published_s = time.monotonic() - began
            wanted = set(keys)
            deadline = time.monotonic() + max(120.0, 4 * args.deliveries / args.limit)
            while True:
                arrivals = await arrivals_since(client, base, since)
                if wanted <= {key for key, _ in arrivals} or time.monotonic() > deadline:
                    break
                await asyncio.sleep(0.25)
            await asyncio.sleep(2.0)  # a late duplicate would arrive in this time
            arrivals = [a for a in await arrivals_since(client, base, since) if a[0] in wanted]
            times = sorted(at for _, at in arrivals)
            counts = Counter(key for key, _ in arrivals)
            claims = await claim_times(settings, wanted)
            result = {
                "claims": len(claims),
                "claims_most_in_1s": most_in_a_window(claims),
                "deliveries": len(keys),
                "published_s": published_s,
                "arrived": len(counts),
                "twice": sum(1 for c in counts.values() if c > 1),
                "missing": len(wanted - set(counts)),
                "most_in_1s": most_in_a_window(times),
                "overall_per_s": (len(times) - 1) / (times[-1] - times[0]) if len(times) > 1 else 0,
                "span_s": times[-1] - times[0] if times else 0.0,
            }
            rounds.append(result)
            console.print(f"{label} round {number} (0: warm-up): {result}")
        holds = await counted(client, ports, "ledger_worker_rate_limit_holds_total")
        paced = await counted(client, ports, "ledger_worker_rate_paced_sends_total")
    finally:
        for child in children:
            stop_child(stack, child)
    return {
        "warmup": rounds[0],
        "rounds": rounds[1:],
        "rate_limit_holds": holds,
        "paced_sends": paced,
    }


async def measure(settings: Settings, stack: Stack, args: argparse.Namespace) -> dict[str, Any]:
    """The limited system, then the baseline, on one receiver."""
    console = Console()
    secret = (settings.channels.webhook_secret or BENCH_WEBHOOK_SECRET).get_secret_value()
    port = peer.free_port(RECEIVER_PORT)
    base = f"http://127.0.0.1:{port}"
    receiver = peer.start_receiver(stack, port, secret)
    try:
        await peer.wait_listening(receiver, base)

        # The workers sign their outcome events (on by default) with a pair of this run's.
        signing, verify = new_pair()

        def with_endpoint(
            limit: float | None, burst: float | None = None, *, pacing: bool = True
        ) -> Settings:
            endpoint = WebhookEndpoint(
                secret=secret, rate_limit_per_s=limit, rate_limit_burst=burst
            )
            return changed(
                settings,
                {
                    "signing.signing_key": signing,
                    "signing.verify_keys": [verify],
                    "channels.webhook_secret": settings.channels.webhook_secret
                    or BENCH_WEBHOOK_SECRET,
                    "channels.webhook_endpoints": {f"{base}/hooks/": endpoint},
                    "channels.rate_limit_pacing": pacing,
                    "channels.allowed_networks": sorted(
                        {*settings.channels.allowed_networks, "127.0.0.0/8"}
                    ),
                },
            )

        async with httpx.AsyncClient(trust_env=False, timeout=30) as client:
            limited = await measure_system(
                "limited", with_endpoint(args.limit), base, stack, client, args, console
            )
            # The baseline of the limit: the claims gated, the sends not paced.
            claims_only = await measure_system(
                "claims-only",
                with_endpoint(args.limit, pacing=False),
                base,
                stack,
                client,
                args,
                console,
            )
            # The trade-off: a burst of two tokens per worker.
            bursty = await measure_system(
                "bursty",
                with_endpoint(args.limit, 2.0 * args.workers),
                base,
                stack,
                client,
                args,
                console,
            )
            unlimited = await measure_system(
                "unlimited", with_endpoint(None), base, stack, client, args, console
            )
    finally:
        stop_child(stack, receiver)
    return {
        "limit": args.limit,
        "workers": args.workers,
        "deliveries": args.deliveries,
        "warmup": args.warmup,
        "partitions": settings.kafka.partitions,
        "timer_interval_s": settings.worker.timer_interval_s,
        "limited": limited,
        "claims_only": claims_only,
        "bursty": bursty,
        "unlimited": unlimited,
    }


SYSTEMS = ("limited", "claims_only", "bursty", "unlimited")
FIGURES = (
    ("most arrivals in any 1 s window", "most_in_1s", "{}", True),
    ("most claims (token grants) in any 1 s window", "claims_most_in_1s", "{}", True),
    ("arrivals/s, first to last arrival", "overall_per_s", "{:.1f}", True),
    ("seconds from first to last arrival", "span_s", "{:.1f}", False),
    ("keys arriving twice", "twice", "{}", False),
    ("keys never arriving", "missing", "{}", False),
)


def table(results: dict[str, Any]) -> str:
    """The figures as BENCHMARKS.md rows, each round: the limited systems beside the
    baseline without a limit."""
    limit = results["limit"]
    lines = [
        "| figure (per round) | limited, paced sends (default burst: 1 token per worker) | "
        "limited, claims only (no pacing, as before) | limited, paced, burst "
        f"{2 * results['workers']} (2 per worker) | no limit (baseline) | limit |",
        "|---|---|---|---|---|---|",
    ]
    for label, name, fmt, against in FIGURES:
        cells = [
            ", ".join(fmt.format(r[name]) for r in results[system]["rounds"]) for system in SYSTEMS
        ]
        lines.append(f"| {label} | {' | '.join(cells)} | {f'{limit:g}' if against else ''} |")
    holds = " | ".join(f"{results[system]['rate_limit_holds']:,.0f}" for system in SYSTEMS)
    warmups = [results[system]["warmup"] for system in SYSTEMS]
    warm = " | ".join(f"{w['most_in_1s']} / {w['claims_most_in_1s']}" for w in warmups)
    label = f"warm-up round ({results['warmup']} deliveries): most arrivals / claims in 1 s"
    lines.append(f"| {label} | {warm} | {limit:g} |")
    paced = " | ".join(f"{results[system].get('paced_sends', 0):,.0f}" for system in SYSTEMS)
    lines.append(f"| sends paced at the hand-off (counter, all rounds) | {paced} |  |")
    lines.append(f"| claims held for a token (counter, all rounds) | {holds} |  |")
    return "\n".join(lines)


def shape(deliveries: int, rounds: int, warmup: int) -> argparse.Namespace:
    """The options ``measure`` takes, for a caller without a command line (bench/run_all.py):
    4 workers against 20/s."""
    return argparse.Namespace(
        deliveries=deliveries, limit=20.0, workers=4, rounds=rounds, warmup=warmup
    )


def rows(results: dict[str, Any], row: Callable[..., None]) -> None:
    """bench/run_all.py's rows: the paced system's arrivals against the claims-only one's
    (as before pacing), in the same invocation."""
    limit = results["limit"]
    paced, before = results["limited"]["rounds"], results["claims_only"]["rounds"]
    most = max(r["most_in_1s"] for r in paced)
    base = max(r["most_in_1s"] for r in before)
    label = f"rate limit {limit:g}/s, {results['workers']} workers"
    row(
        f"{label}: most arrivals in any 1 s (paced sends vs claims gated only)",
        f"{most}",
        f"{base}",
        f"{most / base:.2f}x" if base else "n/a",
        f"<= {limit:g}",
        most <= limit,
    )
    wrong = sum(r["twice"] + r["missing"] for r in paced)
    row(f"{label}: keys arriving twice or never (paced)", f"{wrong}", "", "", "0", wrong == 0)


def note(results: dict[str, Any]) -> str:
    """The details line."""

    def rounds(system: str, name: str, fmt: str = "{}") -> str:
        return ", ".join(fmt.format(r[name]) for r in results[system]["rounds"])

    return (
        f"Rate limit ({results['deliveries']} webhooks per round to one endpoint limited to "
        f"{results['limit']:g}/s, {results['workers']} workers, bench/rate_limit.py): paced "
        f"most arrivals / claims in 1 s {rounds('limited', 'most_in_1s')} / "
        f"{rounds('limited', 'claims_most_in_1s')}, {rounds('limited', 'overall_per_s', '{:.1f}')}"
        f"/s; claims gated only {rounds('claims_only', 'most_in_1s')} / "
        f"{rounds('claims_only', 'claims_most_in_1s')}, "
        f"{rounds('claims_only', 'overall_per_s', '{:.1f}')}/s; no limit "
        f"{rounds('unlimited', 'overall_per_s', '{:.1f}')}/s."
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--deliveries", type=int, default=400, help="per round")
    parser.add_argument("--limit", type=float, default=20.0, help="the endpoint's limit, per s")
    parser.add_argument("--workers", type=int, default=4, choices=range(1, 10))
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--warmup", type=int, default=60, help="deliveries of the warm-up")
    parser.add_argument("--broker-port", type=int, default=BROKER_PORT,
                        help="own broker on this port and the next")  # fmt: skip
    parser.add_argument("--json", type=Path, help="write the raw results here")
    args = parser.parse_args()
    console = Console()
    tmp = Path(tempfile.mkdtemp(prefix="bench-rate-"))
    with bench_broker(tmp, args.broker_port) as settings:
        console.print(f"[bold]broker[/] {settings.kafka.bootstrap_servers} in {tmp}")
        stack = Stack(tmp / "logs")
        try:
            results = asyncio.run(measure(settings, stack, args))
        except BaseException:
            console.print(f"[red]failed[/]: logs kept in {tmp}/logs")
            raise
        finally:
            stack.stop()
        results["machine"] = machine(settings).line()
    shutil.rmtree(tmp, ignore_errors=True)
    if args.json:
        args.json.write_text(json.dumps(results, indent=2))
    console.print(results["machine"])
    print(table(results))


if __name__ == "__main__":
    main()
