"""The whole benchmark suite, one command; rewrites the generated part of BENCHMARKS.md.

    .venv/bin/python -m bench.run_all            # full sizes, 3 rounds each
    .venv/bin/python -m bench.run_all --quick    # smaller sizes, fewer rounds (smoke)

Starts its own broker on 127.0.0.1:29692 (controller 29693; ``--broker-port`` moves it) in
a temp dir and the fake provider (no faults) on free loopback ports (the peer section
starts its own verifying receiver); every figure and its baseline run on that
broker and that receiver in the same invocation. Everything started is stopped again.
The hand-written sections of BENCHMARKS.md below the marker line are kept as they are.
"""

from __future__ import annotations

import argparse
import asyncio
import shutil
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

from bench import (
    blast_radius,
    chaos,
    e2e,
    failover,
    health_query,
    hot_path,
    http_ingest,
    memory,
    peer,
    publisher,
    rate_limit,
    rebuild,
    timers,
    tracing,
)
from bench.common import (
    BROKER_PORT,
    bench_broker,
    dump,
    fresh_settings,
    machine,
    median,
    run_detached,
    start_receiver,
)
from config import Settings
from ledger.stack import Stack

MARKER = "<!-- end of the generated section: hand-written notes below are kept by run_all -->"
SECTIONS = (
    "publisher", "http_ingest", "rebuild", "e2e", "peer", "independent", "memory", "timers",
    "rate_limit", "health", "tracing", "hot_path", "chaos", "failover", "blast_radius",
)  # fmt: skip


@dataclass(frozen=True)
class Sizes:
    """How big and how often."""

    rounds: int
    publisher_runs: int
    rebuild_events: int
    backlog: int
    latency_s: float
    open_deliveries: tuple[int, ...]
    timer_sizes: tuple[int, ...]
    chaos: tuple[str, ...]  # bench.chaos options
    peer: peer.Shape = peer.FULL
    rate_limit: tuple[int, int, int] = (400, 2, 60)  # deliveries per round, rounds, warm-up
    failover: tuple[str, ...] = ("--rate", "10", "--phase-s", "30", "--failovers", "2")
    blast_radius: tuple[str, ...] = ()  # bench.blast_radius options


FULL = Sizes(
    3, 1000, 200_000, 4000, 20.0, (10_000, 1_000_000), (10_000, 1_000_000),
    ("--deliveries", "20000", "--workers", "3", "--seed", "1", "--nemesis-interval", "10"),
)  # fmt: skip
QUICK = Sizes(
    2, 300, 30_000, 1200, 8.0, (10_000, 100_000), (10_000, 100_000), ("--short",), peer.QUICK,
    (200, 1, 40), blast_radius=("--quick",),
)  # fmt: skip


def ratio(value: float, baseline: float) -> str:
    """``value / baseline`` as ``0.53x``."""
    return f"{value / baseline:.2f}x" if baseline else "n/a"


def rounds_of(values: list[float], fmt: str = "{:,.0f}") -> str:
    """Every round, for the record."""
    return ", ".join(fmt.format(v) for v in values)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--quick", action="store_true", help="smaller, fewer rounds")
    parser.add_argument("--only", nargs="*", choices=SECTIONS, help="run only these sections")
    parser.add_argument("--output", type=Path, default=Path("BENCHMARKS.md"))
    parser.add_argument("--broker-port", type=int, default=BROKER_PORT,
                        help="the suite's broker on this port and the next")  # fmt: skip
    args = parser.parse_args()
    sizes = QUICK if args.quick else FULL
    wanted = set(args.only or SECTIONS)
    console = Console()
    tmp = Path(tempfile.mkdtemp(prefix="bench-all-"))
    results: dict[str, Any] = {"sizes": sizes.__dict__, "quick": args.quick}
    began = time.monotonic()
    try:
        with bench_broker(tmp, args.broker_port) as settings:
            results["machine"] = machine(settings)
            console.print(f"[bold]broker[/] {settings.kafka.bootstrap_servers} in {tmp}")
            stack = Stack(tmp / "logs")
            try:
                urls = start_receiver(stack, settings)
                results["receiver"] = urls["base"]
                with Progress(
                    TextColumn("{task.description}"),
                    BarColumn(),
                    TextColumn("{task.completed}/{task.total}"),
                    TimeElapsedColumn(),
                    console=console,
                ) as progress:
                    asyncio.run(run(settings, urls, stack, tmp, sizes, wanted, results, progress))
            finally:
                stack.stop()
        results["seconds"] = time.monotonic() - began
        text = render(results, args)
        write(args.output, text)
        dump(tmp.parent / "bench-all-results.json", results)
        console.print(text)
        console.print(f"[bold]wrote[/] {args.output} (raw rounds: /tmp/bench-all-results.json)")
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


async def run(
    settings: Settings,
    urls: dict[str, str],
    stack: Stack,
    tmp: Path,
    sizes: Sizes,
    wanted: set[str],
    results: dict[str, Any],
    progress: Progress,
) -> None:
    say: Callable[[str], None] = progress.console.print
    for section in SECTIONS:
        if section not in wanted:
            continue
        try:
            await run_section(section, settings, urls, stack, tmp, sizes, results, progress)
        except Exception as exc:
            # One broken section must not cost the others' figures: record it and go on.
            say(f"[red]{section} failed[/]: {type(exc).__name__}: {exc}")
            results.setdefault("errors", {})[section] = f"{type(exc).__name__}: {exc}"


async def run_section(
    section: str,
    settings: Settings,
    urls: dict[str, str],
    stack: Stack,
    tmp: Path,
    sizes: Sizes,
    results: dict[str, Any],
    progress: Progress,
) -> None:
    say: Callable[[str], None] = progress.console.print
    wanted = {section}
    if "publisher" in wanted:
        say("[bold]publisher[/] vs raw transactional produce")
        results["publisher"] = await publisher.measure(
            fresh_settings(settings, "pub"), sizes.publisher_runs, sizes.rounds, progress
        )
    if "http_ingest" in wanted:
        say("[bold]HTTP ingest[/] (issue 28): 8 HTTP clients vs the SDK's 8 callers")
        results["http_ingest"] = await http_ingest.measure(
            fresh_settings(settings, "http"), sizes.publisher_runs, sizes.rounds, progress
        )
    if "rebuild" in wanted:
        say("[bold]rebuild[/] into SQLite vs raw read + decode")
        results["rebuild"] = await rebuild.figures(
            fresh_settings(settings, "rebuild"), sizes.rebuild_events, 5000, sizes.rounds, progress
        )
    if "e2e" in wanted:
        for kind in ("bare", "worker"):
            say(f"[bold]end to end[/]: {kind}")
            results[f"e2e_{kind}"] = await e2e.measure_system(
                kind,
                settings,
                urls,
                stack,
                backlog=sizes.backlog,
                rounds=sizes.rounds,
                latency_s=sizes.latency_s,
                progress=progress,
            )
    if "peer" in wanted:
        say("[bold]peer shape[/] (issue 12): receiver alone, then bare loops, then workers")
        results["peer"] = await peer.measure(settings, stack, sizes.peer, progress)
    if "independent" in wanted:
        say(
            "[bold]independent agents[/] (issue 31): the SDK's transaction and record modes, "
            "then 32 HTTP clients, each to our workers and the verifying receiver"
        )
        results["independent"] = await peer.measure_independent(
            settings, stack, sizes.peer, progress
        )
    if "memory" in wanted:
        say("[bold]worker memory[/] with open deliveries (and timer ticks inside it)")
        results["memory"] = await memory.measure(
            settings, stack, tmp, sizes.open_deliveries, progress
        )
    if "timers" in wanted:
        say("[bold]timer tick[/] micro-benchmark (DueIndex + DeliveryProcessor.tick)")
        results["timers"] = await timers.measure(tmp, sizes.timer_sizes, sizes.rounds, progress)
    if "rate_limit" in wanted:
        say("[bold]rate limit[/] (issue 27): 4 workers against one endpoint limited to 20/s")
        results["rate_limit"] = await rate_limit.measure(
            settings, stack, rate_limit.shape(*sizes.rate_limit)
        )
    if "health" in wanted:
        say("[bold]endpoint health query[/] (issue 27) at 10k and 100k deliveries")
        results["health"] = await asyncio.to_thread(
            health_query.measure, health_query.SIZES, sizes.rounds
        )
    if "tracing" in wanted:
        say("[bold]tracing[/] (issue 29): worker CPU per delivery, off and on, side by side")
        results["tracing"] = await tracing.measure(
            settings,
            urls,
            stack,
            backlog=sizes.backlog // 2,
            rounds=sizes.rounds,
            progress=progress,
        )
    if "hot_path" in wanted:
        say("[bold]hot path[/] (issue 31 item 3): worker CPU per delivery, the hot events' codec")
        results["hot_path"] = await hot_path.measure(
            settings,
            urls,
            stack,
            backlog=sizes.backlog // 2,
            rounds=sizes.rounds,
            progress=progress,
        )
    if "chaos" in wanted:
        say(f"[bold]chaos[/] nemesis run, its own broker and stack: {' '.join(sizes.chaos)}")
        results["chaos"] = await asyncio.to_thread(
            run_detached, "bench.chaos", list(sizes.chaos), tmp
        )
    if "failover" in wanted:
        say(f"[bold]failover[/] a three-node cluster of its own: {' '.join(sizes.failover)}")
        results["failover"] = await asyncio.to_thread(
            run_detached, "bench.failover", list(sizes.failover), tmp
        )
    if "blast_radius" in wanted:
        say("[bold]blast radius[/] (issue 31): kills and a rolling restart, its own broker")
        results["blast_radius"] = await asyncio.to_thread(
            run_detached, "bench.blast_radius", list(sizes.blast_radius), tmp
        )


def render(results: dict[str, Any], args: argparse.Namespace) -> str:
    """The generated section of BENCHMARKS.md."""
    m = results["machine"]
    command = "python -m bench.run_all" + (" --quick" if args.quick else "")
    out = [
        "# Benchmarks",
        "",
        f"Generated by `{command}` on {datetime.now(UTC):%Y-%m-%d %H:%M} UTC in "
        f"{results['seconds'] / 60:.1f} min. Machine: {m.line()}.",
        "",
        "Every figure is the median of the rounds listed, and its baseline was measured in the "
        "same invocation on the same broker (a fresh local single-node KRaft broker, 8 "
        "partitions per topic) and the same receiver (the fake provider, one process, no "
        "faults, dedupe on). Everything shares the machine's CPUs: the broker, the "
        "receiver, the measured processes and the benchmark's own reader.",
        "",
        "| figure | value | baseline | ratio | target | met |",
        "|---|---|---|---|---|---|",
    ]
    notes: list[str] = []
    targets: list[str] = []

    def row(
        label: str, value: str, base: str, r: str, target: str = "", met: bool | None = None
    ) -> None:
        mark = "" if met is None else ("yes" if met else "**no**")
        out.append(f"| {label} | {value} | {base} | {r} | {target} | {mark} |")
        if met is not None:
            against = f"baseline {base}, target {target}" if base else f"target {target}"
            targets.append(f"{label}: {'met' if met else 'NOT met'} ({value}; {against})")

    if "e2e_worker" in results and "e2e_bare" in results:
        w, b = results["e2e_worker"], results["e2e_bare"]
        wp, bp = median(w["peak_per_s"]), median(b["peak_per_s"])
        row(
            "end to end, peak deliveries/s (2 `ledger worker` vs 2 bare loops)",
            f"{wp:,.0f}",
            f"{bp:,.0f}",
            ratio(wp, bp),
            ">= 0.5x",
            wp >= 0.5 * bp,
        )
        wc, bc = median(w["cpu_ms_per_delivery"]), median(b["cpu_ms_per_delivery"])
        row(
            "end to end, CPU ms per delivery in the 2 processes (at peak)",
            f"{wc:.2f}",
            f"{bc:.2f}",
            ratio(wc, bc),
        )
        for q, target in (("p50", None), ("p99", 3.0)):
            wl, bl = median(w[f"{q}_ms"]), median(b[f"{q}_ms"])
            row(
                f"publish -> CONFIRMED {q} at half of own peak (ms)",
                f"{wl:,.0f}",
                f"{bl:,.0f}",
                ratio(wl, bl),
                f"<= {target:.0f}x" if target else "",
                None if target is None else wl <= target * bl,
            )
        notes.append(
            f"End to end: backlog of {results['sizes']['backlog']:,} requests per peak round; "
            f"peak worker rounds {rounds_of(w['peak_per_s'])}/s, bare {rounds_of(b['peak_per_s'])}"
            f"/s. Latency runs paced at {w['half_peak_per_s']:.0f}/s (worker; offered "
            f"{rounds_of(w['offered_per_s'])}) and {b['half_peak_per_s']:.0f}/s (bare; offered "
            f"{rounds_of(b['offered_per_s'])}) for {results['sizes']['latency_s']:.0f} s each: "
            f"worker p50 {rounds_of(w['p50_ms'])} ms, p99 {rounds_of(w['p99_ms'])} ms; "
            f"bare p50 {rounds_of(b['p50_ms'])} ms, p99 {rounds_of(b['p99_ms'])} ms."
        )
        split = w.get("breakdown_ms", {})
        if split.get("to_claim_p50_ms"):
            notes.append(
                "Worker latency split (medians over rounds): publish -> claim appended p50 "
                f"{median(split['to_claim_p50_ms']):,.0f} ms, p99 "
                f"{median(split['to_claim_p99_ms']):,.0f} ms; claim -> CONFIRMED p50 "
                f"{median(split['claim_to_confirmed_p50_ms']):,.0f} ms, p99 "
                f"{median(split['claim_to_confirmed_p99_ms']):,.0f} ms."
            )
    if "publisher" in results:
        p = results["publisher"]
        s, r = median(p["sdk_1"]), median(p["raw_1"])
        row("publisher runs/s, 1 caller (1 delivery/run) vs raw aiokafka, 1 txn/run",
            f"{s:,.0f}", f"{r:,.0f}", ratio(s, r))  # fmt: skip
        s, r = median(p["sdk_8"]), median(p["raw_8"])
        row("publisher runs/s, 8 callers, group commit vs 8 raw producers, 1 txn/run",
            f"{s:,.0f}", f"{r:,.0f}", ratio(s, r), ">= 1,000", s >= 1000)  # fmt: skip
        notes.append(
            f"Publisher: {results['sizes']['publisher_runs']:,} runs per round of 1 "
            f"RunSucceeded + 1 webhook DeliveryRequested; 1 caller: SDK {rounds_of(p['sdk_1'])}, "
            f"raw {rounds_of(p['raw_1'])}; 8 callers: SDK {rounds_of(p['sdk_8'])}, raw "
            f"{rounds_of(p['raw_8'])} runs/s."
        )
    if "http_ingest" in results:
        http_ingest.rows(results["http_ingest"], row)
        notes.append(http_ingest.note(results["http_ingest"]))
    if "rebuild" in results:
        rb = results["rebuild"]
        s, r = median(rb["sqlite_per_s"]), median(rb["raw_per_s"])
        row(
            "rebuild into SQLite, events/s vs raw read + decode",
            f"{s:,.0f}",
            f"{r:,.0f}",
            ratio(s, r),
            ">= 0.7x (issue 12)",
            s >= 0.7 * r,
        )
        notes.append(
            f"Rebuild: {rb['records']:,} records (runs of 14 events); SQLite "
            f"{rounds_of(rb['sqlite_per_s'])} ({rb.get('workers', 1)} worker processes), raw "
            f"{rounds_of(rb['raw_per_s'])} events/s"
            + (
                f"; sequential (--workers 1) in the same rounds {rounds_of(seq)}."
                if (seq := rb.get("sequential_per_s"))
                else "."
            )
        )
    if "peer" in results:
        peer.rows(results["peer"], row)
        notes.append(peer.note(results["peer"]))
    if "independent" in results:
        peer.independent_rows(results["independent"], row)
        notes.append(peer.independent_note(results["independent"]))
    if "memory" in results:
        memory.rows(results["memory"], row)
        notes.append(memory.note(results["memory"]))
    if "timers" in results:
        timers.rows(results["timers"], row)
        notes.append(timers.note(results["timers"]))
    if "rate_limit" in results:
        rate_limit.rows(results["rate_limit"], row)
        notes.append(rate_limit.note(results["rate_limit"]))
    if "health" in results:
        health_query.rows(results["health"], row)
        notes.append(health_query.note(results["health"]))
    if "tracing" in results:
        tracing.rows(results["tracing"], row)
        notes.append(tracing.note(results["tracing"]))
    if "hot_path" in results:
        hot_path.rows(results["hot_path"], row)
        notes.append(hot_path.note(results["hot_path"]))
    for section, error in results.get("errors", {}).items():
        notes.append(f"**{section} failed in this run**: {error}")
    out += ["", "Targets:", ""] + [f"- {t}" for t in targets]
    out += ["", "Details:", ""] + [f"- {n}" for n in notes]
    if "chaos" in results:
        out += ["", *chaos.markdown(results["chaos"])]
    if "failover" in results:
        out += ["", *failover.markdown(results["failover"])]
    if "blast_radius" in results:
        out += ["", *blast_radius.markdown(results["blast_radius"])]
    return "\n".join(out) + "\n"


def write(path: Path, generated: str) -> None:
    """Replace the generated part of ``path``; keep what follows the marker."""
    kept = ""
    if path.exists():
        text = path.read_text()
        if MARKER in text:
            kept = text.split(MARKER, 1)[1]
    path.write_text(generated + "\n" + MARKER + kept)


if __name__ == "__main__":
    main()
