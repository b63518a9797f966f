"""The demo's chaos loop: while the runs are published, watch the deliveries settle, SIGKILL
one worker once 40% have settled (a crash: its leases expire and lookups settle what it had
in flight) and restart any worker that exits, as a supervisor would, until every published
delivery has settled or ``SETTLE_TIMEOUT_S`` has passed."""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field

from rich.console import Console
from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

from ledger.demo.assembly import DemoStack
from ledger.demo.runs import deliveries_for
from ledger.demo.summary import status_line
from ledger.observe import LedgerObserver
from ledger.stack import Child, Stack

SETTLE_TIMEOUT_S = 300.0
KILLED_WORKER = "demo-w1"
KILL_AT_SETTLED = 0.4


@dataclass
class Chaos:
    """What the loop did to the workers."""

    stack: Stack
    demo: DemoStack
    killed: str | None = None
    restarts: list[str] = field(default_factory=list)

    def restart_exited(self, console: Console) -> None:
        """A supervisor's job: restart a worker that exited, count it, say so."""
        workers = self.demo.workers
        for name, worker in list(workers.items()):
            if worker.process.poll() is not None and worker in self.stack.children:
                self.restarts.append(name)
                console.print(
                    f"[red]worker {name} exited ({worker.process.returncode})[/]; "
                    f"restarting it (see {worker.log})"
                )
                self.stack.children.remove(worker)
                workers[name] = self._start(name)

    def kill_once(self, console: Console) -> None:
        """SIGKILL one worker (once), then start it again."""
        if self.killed is not None:
            return
        self.killed = KILLED_WORKER
        self.stack.kill(self.demo.workers[self.killed])
        console.print(
            f"[yellow]SIGKILL[/] {self.killed} mid-run (a crash); "
            "restarting it: its leases expire and lookups settle "
            "what it had in flight"
        )
        self.demo.workers[self.killed] = self._start(self.killed)

    def _start(self, name: str) -> Child:
        return self.stack.start(name, ["worker", "--name", name], self.demo.settings)


async def settle(
    chaos: Chaos,
    observer: LedgerObserver,
    out: Console,
    runs: int,
    publishing: asyncio.Task[None],
    published: list[str],
) -> None:
    """Watch the deliveries settle under the chaos, with a progress bar; then wait for the
    publisher."""
    expected = deliveries_for(runs)
    with Progress(
        TextColumn("{task.description}"),
        BarColumn(),
        TextColumn("{task.completed}/{task.total} settled"),
        TimeElapsedColumn(),
        console=out,
    ) as progress:
        task = progress.add_task("deliveries", total=expected)
        deadline = time.monotonic() + SETTLE_TIMEOUT_S
        while time.monotonic() < deadline:
            await observer.poll(300)
            counts = observer.by_status()
            progress.update(task, completed=observer.settled, description=status_line(counts))
            chaos.restart_exited(progress.console)
            if observer.settled >= expected * KILL_AT_SETTLED:
                chaos.kill_once(progress.console)
            if publishing.done() and observer.settled >= len(published):
                break
    await publishing
