"""What one webhook POST costs the client: httpx's transports, pool settings, event loops.

A receiver in its own process (aiohttp, 127.0.0.1, a port below the ephemeral range)
answers every POST with 200 and a small JSON body. For each client configuration a fresh
client process sends ``--requests`` signed webhook POSTs through the real
``WebhookChannel.send`` (signing, the hard deadline, classification) with ``--concurrency``
sends in flight (the worker's ``send_concurrency``), after a warm-up, and reports
requests/s and its own CPU time (user + system, ``resource.getrusage``) per request.
Rounds interleave the configurations; the table shows the median of the rounds.

    .venv/bin/python -m bench.http_client --rounds 5 --requests 3000 --concurrency 64

Configurations (``--only NAME ...`` picks some):

* ``httpcore``: ``streams.channels.http.create_http_client``, what the worker uses (httpx,
  httpcore pool, the SSRF-guarded network backend, keep-alive 2 s, pool = concurrency).
* ``guarded-aiohttp``: ``create_http_client`` with ``LEDGER_CHANNELS__HTTP_POOL=aiohttp``
  (``streams/channels/aiohttp_transport.py``: the same guards over aiohttp's pool).
* ``httpcore-ka30``: the same pool with keep-alive 30 s.
* ``httpcore-pool16``: the same with 16 connections for 64 sends in flight.
* ``httpcore-nokeep``: the same with no keep-alive (a new connection per request).
* ``httpx-default``: httpx's own ``AsyncHTTPTransport`` (no address guard), same limits.
* ``aiohttp``: httpx over ``httpx_aiohttp.AiohttpTransport`` with the same limits
  (aiohttp ``TCPConnector(limit=concurrency, keepalive_timeout=2)``); not guarded.
* ``aiohttp-ka30``: the same with keep-alive 30 s.
* ``aiohttp-raw``: aiohttp's ``ClientSession`` alone, the same signed request (no httpx,
  no classification): the floor of what an aiohttp-based client could cost.

Each runs on asyncio's default loop and, with ``--loops asyncio uvloop``, on uvloop.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import resource
import socket
import statistics
import subprocess
import sys
import time
import uuid
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import httpx

from config.settings import Settings, address_policy, changed
from events.ports import free_port

CONFIGS = (
    "httpcore",
    "guarded-aiohttp",
    "httpcore-ka30",
    "httpcore-pool16",
    "httpcore-nokeep",
    "httpx-default",
    "aiohttp",
    "aiohttp-ka30",
    "aiohttp-raw",
)
SECRET = "whsec_" + "YmVuY2gtaHR0cC1jbGllbnQtb25seQ=="  # base64("bench-http-client-only")


# --- the receiver (its own process) ---------------------------------------------------


def serve(port: int) -> None:
    """An aiohttp server on 127.0.0.1:``port`` answering every POST 200 with a JSON id."""
    from aiohttp import web

    counter = 0
    peers: set[object] = set()

    async def hook(request: web.Request) -> web.Response:
        nonlocal counter
        await request.read()
        counter += 1
        if request.transport is not None:
            peers.add(request.transport.get_extra_info("peername"))
        return web.json_response({"id": f"r{counter}"})

    async def connections(request: web.Request) -> web.Response:
        # How many client connections carried requests since the last call (then reset).
        seen = len(peers)
        peers.clear()
        return web.json_response({"connections": seen})

    app = web.Application()
    app.router.add_post("/hooks/{name}", hook)
    app.router.add_get("/connections", connections)
    web.run_app(app, host="127.0.0.1", port=port, print=None, access_log=None, backlog=1024)


def wait_listening(port: int, timeout_s: float = 15.0) -> None:
    """Until 127.0.0.1:``port`` accepts a connection (bounded)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.5):
                return
        except OSError:
            time.sleep(0.1)
    raise RuntimeError(f"receiver on 127.0.0.1:{port} did not come up in {timeout_s}s")


# --- the client (one process per configuration and round) ------------------------------


def client_settings(concurrency: int) -> Settings:
    """The worker's HTTP settings, allowed to reach the loopback receiver."""
    return Settings(
        channels={
            "send_concurrency": concurrency,
            "allowed_networks": ["127.0.0.0/8"],
            "webhook_secret": SECRET,
        }
    )


def build_client(name: str, settings: Settings) -> httpx.AsyncClient:
    """The httpx client of configuration ``name`` (all but ``aiohttp-raw``)."""
    from streams.channels import http

    if name == "httpcore":
        return http.create_http_client(
            changed(settings, {"channels.http_pool": "httpcore"}).channels
        )
    if name.startswith("guarded-aiohttp"):
        return http.create_http_client(
            changed(settings, {"channels.http_pool": "aiohttp"}).channels
        )
    concurrency = settings.channels.send_concurrency
    limits = {
        "httpcore-ka30": httpx.Limits(
            max_connections=concurrency, max_keepalive_connections=concurrency, keepalive_expiry=30
        ),
        "httpcore-pool16": httpx.Limits(
            max_connections=16, max_keepalive_connections=16, keepalive_expiry=2
        ),
        "httpcore-nokeep": httpx.Limits(max_connections=concurrency, max_keepalive_connections=0),
        "httpx-default": httpx.Limits(
            max_connections=concurrency, max_keepalive_connections=concurrency, keepalive_expiry=2
        ),
        "aiohttp": httpx.Limits(
            max_connections=concurrency, max_keepalive_connections=concurrency, keepalive_expiry=2
        ),
        "aiohttp-ka30": httpx.Limits(
            max_connections=concurrency, max_keepalive_connections=concurrency, keepalive_expiry=30
        ),
    }[name]
    transport: httpx.AsyncBaseTransport
    if name.startswith("httpcore"):
        transport = http._GuardedTransport(limits, address_policy(settings.channels))
    elif name == "httpx-default":
        transport = httpx.AsyncHTTPTransport(limits=limits, trust_env=False)
    else:
        from httpx_aiohttp import AiohttpTransport

        transport = AiohttpTransport(limits=limits, trust_env=False)
    timeout = httpx.Timeout(
        settings.channels.http_timeout_s,
        connect=settings.channels.http_connect_timeout_s,
        pool=settings.channels.http_timeout_s,
    )
    return httpx.AsyncClient(
        timeout=timeout,
        transport=transport,
        trust_env=False,
        follow_redirects=False,
        headers={"user-agent": http.USER_AGENT},
    )


async def run_sends(count: int, concurrency: int, send: Callable[[int], Awaitable[bool]]) -> int:
    """``count`` sends, ``concurrency`` at a time; how many failed."""
    next_index = 0
    failed = 0

    async def lane() -> None:
        nonlocal next_index, failed
        while next_index < count:
            index = next_index
            next_index += 1
            if not await send(index):
                failed += 1

    await asyncio.gather(*(lane() for _ in range(concurrency)))
    return failed


async def measure(name: str, url: str, count: int, concurrency: int, warm: int) -> dict[str, Any]:
    """Warm up, then ``count`` sends; rate and CPU per request of this process."""
    from streams.channels.base import OutboundDelivery, SendOutcome
    from streams.channels.webhook import WebhookChannel

    settings = client_settings(concurrency)
    run = uuid.uuid4().hex[:8]

    def delivery(index: int) -> OutboundDelivery:
        return OutboundDelivery(
            idempotency_key=f"{run}-{index}",
            run_id=f"run-{index}",
            event_type="report.ready",
            channel="webhook",
            recipient=url,
            payload={"text": "report ready", "n": index},
            attempt=1,
            fencing_token=1,
        )

    closer: Callable[[], Awaitable[Any]]
    if name == "aiohttp-raw":
        import aiohttp

        channel = WebhookChannel(httpx.AsyncClient(), settings.channels)  # for signing only
        session = aiohttp.ClientSession(
            connector=aiohttp.TCPConnector(limit=concurrency, keepalive_timeout=2),
            timeout=aiohttp.ClientTimeout(total=settings.channels.send_deadline_s),
        )
        closer = session.close

        async def send(index: int) -> bool:
            body, headers = channel.signed_request(delivery(index), int(time.time()))
            async with session.post(url, data=body, headers=headers) as answer:
                await answer.read()
                return answer.status == 200

    else:
        client = build_client(name, settings)
        channel = WebhookChannel(client, settings.channels)
        closer = client.aclose

        async def send(index: int) -> bool:
            result = await channel.send(delivery(index))
            return result.outcome is SendOutcome.CONFIRMED

    stats = url.split("/hooks/")[0] + "/connections"
    try:
        await run_sends(warm, concurrency, send)
        await _connections(stats)
        began_cpu = _cpu()
        began = time.perf_counter()
        failed = await run_sends(count, concurrency, send)
        wall = time.perf_counter() - began
        cpu = _cpu() - began_cpu
        connections = await _connections(stats)
    finally:
        await closer()
    return {
        "config": name,
        "rate": count / wall,
        "cpu_us": cpu * 1e6 / count,
        "failed": failed,
        "connections": connections,
    }


async def _connections(url: str) -> int:
    """The receiver's count of client connections since the last ask (outside the timing)."""
    async with httpx.AsyncClient(trust_env=False) as probe:
        answer = await probe.get(url)
    return int(answer.json()["connections"])


def _cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def client_main(args: argparse.Namespace) -> None:
    """One configuration on one loop: print one JSON line."""
    factory: Callable[[], asyncio.AbstractEventLoop] | None = None
    if args.loop == "uvloop":
        import uvloop

        factory = uvloop.new_event_loop
    with asyncio.Runner(loop_factory=factory) as runner:
        result = runner.run(
            measure(args.client, args.url, args.requests, args.concurrency, args.warm)
        )
    result["loop"] = args.loop
    print(json.dumps(result), flush=True)


# --- the driver -------------------------------------------------------------------------


def run_client(name: str, loop: str, url: str, args: argparse.Namespace) -> dict[str, Any]:
    """One client process; its JSON line."""
    command = [sys.executable, "-m", "bench.http_client", "--client", name, "--loop", loop]
    command += ["--url", url, "--requests", str(args.requests)]
    command += ["--concurrency", str(args.concurrency), "--warm", str(args.warm)]
    done = subprocess.run(command, capture_output=True, text=True, timeout=600, check=False)
    if done.returncode != 0:
        raise RuntimeError(f"{name}/{loop} failed:\n{done.stderr[-2000:]}")
    result: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    return result


def report(results: list[dict[str, Any]], args: argparse.Namespace) -> str:
    """A markdown table: median rate and CPU per request per configuration and loop."""
    lines = [
        f"{args.requests:,} signed POSTs per round, {args.concurrency} in flight, "
        f"{args.rounds} rounds (median; rounds in brackets)",
        "",
        "| client | loop | requests/s | client CPU us/request | rounds (us/request) "
        "| connections used |",
        "|---|---|---|---|---|---|",
    ]
    keys = list(dict.fromkeys((r["config"], r["loop"]) for r in results))
    for name, loop in keys:
        mine = [r for r in results if (r["config"], r["loop"]) == (name, loop)]
        rate = statistics.median(r["rate"] for r in mine)
        cpu = statistics.median(r["cpu_us"] for r in mine)
        rounds = ", ".join(f"{r['cpu_us']:.0f}" for r in mine)
        used = ", ".join(str(r["connections"]) for r in mine)
        failed = sum(r["failed"] for r in mine)
        note = f" ({failed} failed)" if failed else ""
        lines.append(f"| {name}{note} | {loop} | {rate:,.0f} | {cpu:,.0f} | {rounds} | {used} |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawTextHelpFormatter
    )
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--requests", type=int, default=3000)
    parser.add_argument("--concurrency", type=int, default=64)
    parser.add_argument("--warm", type=int, default=300)
    parser.add_argument("--only", nargs="+", choices=CONFIGS, default=list(CONFIGS))
    parser.add_argument("--loops", nargs="+", choices=("asyncio", "uvloop"), default=["asyncio"])
    parser.add_argument("--json-out", type=Path, default=None, help="raw rounds as JSON")
    parser.add_argument("--serve", type=int, default=None, help=argparse.SUPPRESS)
    parser.add_argument("--client", choices=CONFIGS, default=None, help=argparse.SUPPRESS)
    parser.add_argument("--loop", default="asyncio", help=argparse.SUPPRESS)
    parser.add_argument("--url", default="", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.serve is not None:
        serve(args.serve)
        return
    if args.client is not None:
        client_main(args)
        return
    port = free_port()
    receiver = subprocess.Popen(
        [sys.executable, "-m", "bench.http_client", "--serve", str(port)],
        stdin=subprocess.DEVNULL,
    )
    try:
        wait_listening(port)
        url = f"http://127.0.0.1:{port}/hooks/bench"
        results: list[dict[str, Any]] = []
        for round_number in range(1, args.rounds + 1):
            for name in args.only:
                for loop in args.loops:
                    result = run_client(name, loop, url, args)
                    result["round"] = round_number
                    results.append(result)
                    print(
                        f"round {round_number} {name:16} {loop:8} {result['rate']:7,.0f}/s "
                        f"{result['cpu_us']:6,.0f} us/request, "
                        f"{result['connections']} connections",
                        flush=True,
                    )
        print()
        print(report(results, args))
        if args.json_out is not None:
            args.json_out.write_text(json.dumps(results, indent=1))
    finally:
        receiver.terminate()
        receiver.wait(timeout=10)


if __name__ == "__main__":
    main()
