"""The chaos run's process supervisor and its seeded nemesis.

The supervisor keeps the `ledger worker` processes (and the live projector) running the
way systemd or Kubernetes would: a process that exits on its own is started again, and
counted. The nemesis picks one fault every few seconds from a seeded generator, so a seed
names a schedule of actions (the timing still depends on the machine).
"""

from __future__ import annotations

import asyncio
import random
import signal
import time
from collections import Counter
from dataclasses import asdict, dataclass, field
from typing import Any

from bench.common import stop_child
from config import Settings
from ledger.broker import LocalBroker
from ledger.stack import Child, Stack

ACTIONS = ("kill", "pause", "join", "leave", "broker_restart")
PROJECTOR = "projector"


@dataclass
class Supervisor:
    """Starts, restarts and signals the workers and the projector of one run."""

    stack: Stack
    settings: Settings
    children: dict[str, Child] = field(default_factory=dict)
    paused: set[str] = field(default_factory=set)
    restarts: Counter[str] = field(default_factory=Counter)
    _serial: int = 0

    def start_worker(self, name: str | None = None) -> str:
        """Start ``ledger worker`` (a new name unless given: each has its own state dir)."""
        if name is None:
            self._serial += 1
            name = f"w{self._serial}"
        self.children[name] = self.stack.start(name, ["worker", "--name", name], self.settings)
        return name

    def start_projector(self) -> None:
        """Start the live ``ledger project`` into the default SQLite file."""
        self.children[PROJECTOR] = self.stack.start(PROJECTOR, ["project"], self.settings)

    def workers(self) -> list[str]:
        """Names of the workers currently supervised (paused ones included)."""
        return sorted(name for name in self.children if name != PROJECTOR)

    def revive(self) -> list[str]:
        """Restart every supervised process that exited on its own; their names."""
        revived = []
        for name, child in list(self.children.items()):
            if child.alive():
                continue
            self.stack.children.remove(child)
            self.restarts[name] += 1
            if name == PROJECTOR:
                self.start_projector()
            else:
                self.start_worker(name)
            revived.append(name)
        return revived

    def kill(self, name: str) -> None:
        """SIGKILL (a crash), then start it again under the same name."""
        self.stack.kill(self.children.pop(name))
        self.start_worker(name)

    def stop(self, name: str) -> bool:
        """SIGTERM and wait: a graceful leave (the supervisor no longer restarts it); True if
        it did not exit within 30 s and had to be SIGKILLed."""
        return stop_child(self.stack, self.children.pop(name))

    async def stop_workers(self) -> list[str]:
        """SIGTERM every worker at once and wait; the names that had to be SIGKILLed."""
        self.resume_all()
        names = self.workers()
        killed = await asyncio.gather(*(asyncio.to_thread(self.stop, n) for n in names))
        return [name for name, k in zip(names, killed, strict=True) if k]

    def pause(self, name: str) -> None:
        """SIGSTOP: the process keeps its sockets and its claims, and does nothing."""
        self.children[name].process.send_signal(signal.SIGSTOP)
        self.paused.add(name)

    def resume(self, name: str) -> None:
        """SIGCONT a paused process."""
        if name in self.paused:
            self.paused.discard(name)
            if name in self.children:
                self.children[name].process.send_signal(signal.SIGCONT)

    def resume_all(self) -> None:
        """SIGCONT everything paused (before stopping, or a stopped child never exits)."""
        for name in list(self.paused):
            self.resume(name)


@dataclass(frozen=True)
class Action:
    """One thing the nemesis did: when (seconds into the run), what, to whom, how long."""

    at_s: float
    action: str
    target: str
    took_s: float
    detail: str = ""


@dataclass
class Nemesis:
    """Every interval, one seeded fault: SIGKILL, SIGSTOP past the lease, join, leave, or a
    broker restart (each once in every five actions)."""

    rng: random.Random
    supervisor: Supervisor
    broker: LocalBroker
    base_workers: int
    pause_s: float  # SIGSTOP this long: past the lease, so the worker's claims expire
    began: float = field(default_factory=time.monotonic)
    log: list[Action] = field(default_factory=list)
    _bag: list[str] = field(default_factory=list)

    def _next(self) -> str:
        # A shuffled bag, refilled when empty: random order, yet every kind of fault comes
        # once in each five actions, so even a short run restarts the broker.
        if not self._bag:
            self._bag = list(ACTIONS)
            self.rng.shuffle(self._bag)
        return self._bag.pop()

    async def act(self) -> Action:
        """Pick and carry out one action; returns it (also kept in ``log``)."""
        started = time.monotonic()
        action = self._next()
        workers = self.supervisor.workers()
        target, detail = "", ""
        if action in ("join", "leave"):
            # Membership changes drift around the base size, never below one worker.
            action = "join" if len(workers) <= self.base_workers else "leave"
        if action == "kill":
            target = self.rng.choice(workers)
            self.supervisor.kill(target)
            detail = "SIGKILL, restarted at once"
        elif action == "pause":
            target = self.rng.choice(workers)
            self.supervisor.pause(target)
            await asyncio.sleep(self.pause_s)
            self.supervisor.resume(target)
            detail = f"SIGSTOP for {self.pause_s:g}s, then SIGCONT"
        elif action == "join":
            target = self.supervisor.start_worker()
            detail = f"{len(workers) + 1} workers"
        elif action == "leave":
            target = self.rng.choice(workers)
            killed = await asyncio.to_thread(self.supervisor.stop, target)
            late = " (no exit in 30 s: SIGKILLed)" if killed else ""
            detail = f"SIGTERM{late}, {len(workers) - 1} workers"
        else:
            target = "broker"
            _pid, stop_s, had_to_kill = await asyncio.to_thread(self.broker.stop)
            await asyncio.to_thread(self.broker.start)
            detail = f"stopped in {stop_s:.1f}s{' (SIGKILL)' if had_to_kill else ''}, started"
        done = Action(
            round(started - self.began, 1),
            action,
            target,
            round(time.monotonic() - started, 1),
            detail,
        )
        self.log.append(done)
        return done

    def heal(self) -> None:
        """Undo what is still in effect: continue paused workers, back to the base size."""
        self.supervisor.resume_all()
        while len(self.supervisor.workers()) < self.base_workers:
            self.supervisor.start_worker()

    def counts(self) -> dict[str, int]:
        """Actions taken, by kind."""
        return dict(Counter(a.action for a in self.log))

    def records(self) -> list[dict[str, Any]]:
        """The action log as JSON-able rows."""
        return [asdict(a) for a in self.log]
