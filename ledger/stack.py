"""Child processes of the local stack (workers, projector, simulator, dashboard), run as a
user would run them: ``python -m ledger ...`` with ``LEDGER_*`` settings in the environment.

Every child gets PR_SET_PDEATHSIG, so even if the parent is killed outright, nothing it
started is left running.
"""

from __future__ import annotations

import contextlib
import ctypes
import json
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

from config.legacy import is_settings_variable
from config.settings import Settings, settings_environment

_PR_SET_PDEATHSIG = 1


def _die_with_parent() -> None:
    # Not Linux: no prctl; the parent's own cleanup still stops its children.
    with contextlib.suppress(OSError):
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGTERM)


# Settings variables newer than the checkouts a benchmark or a test compares with (an
# older worker run from another tree refuses a variable it does not know): left out of
# such a worker's environment, where they keep their defaults.
NEWER_SETTINGS = ("LEDGER_WORKER__STATIC_MEMBERSHIP",)


def settings_env(settings: Settings) -> dict[str, str]:
    """The environment under which a child process sees exactly ``settings``.

    Every settings variable inherited from this process, under its new or its old flat
    name, is dropped first: the child reads ``settings`` alone, and no old name warns."""
    env = {name: value for name, value in os.environ.items() if not is_settings_variable(name)}
    env.update(settings_environment(settings))
    return env


@dataclass
class Child:
    """One started process and its log file."""

    name: str
    process: subprocess.Popen[bytes]
    log: Path

    def alive(self) -> bool:
        """Still running?"""
        return self.process.poll() is None


@dataclass
class Stack:
    """The processes one command started; ``stop()`` ends them all."""

    logs: Path
    children: list[Child] = field(default_factory=list)

    def start(
        self, name: str, args: list[str], settings: Settings, stdout: int | IO[bytes] | None = None
    ) -> Child:
        """Start ``python -m ledger ARGS`` with ``settings``; output goes to ``logs/NAME.log``."""
        self.logs.mkdir(parents=True, exist_ok=True)
        log = self.logs / f"{name}.log"
        with open(log, "ab") as out:
            process = subprocess.Popen(
                [sys.executable, "-m", "ledger", *args],
                env=settings_env(settings),
                stdout=stdout if stdout is not None else out,
                stderr=out,
                stdin=subprocess.DEVNULL,
                preexec_fn=_die_with_parent,
            )
        child = Child(name, process, log)
        self.children.append(child)
        return child

    def kill(self, child: Child) -> None:
        """SIGKILL one child (a crash, for the demo's fault injection)."""
        if child.alive():
            child.process.send_signal(signal.SIGKILL)
        child.process.wait(timeout=30)
        self.children.remove(child)

    def stop(self, timeout_s: float = 20.0) -> list[str]:
        """SIGTERM every child, wait, SIGKILL stragglers; returns what had to be killed."""
        for child in self.children:
            if child.alive():
                child.process.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + timeout_s
        killed = []
        for child in self.children:
            remaining = max(0.1, deadline - time.monotonic())
            try:
                child.process.wait(timeout=remaining)
            except subprocess.TimeoutExpired:
                child.process.kill()
                child.process.wait(timeout=10)
                killed.append(child.name)
        self.children.clear()
        return killed


def read_json_line(child: Child, timeout_s: float = 30.0) -> dict[str, Any]:
    """The first stdout line of a child started with ``stdout=subprocess.PIPE``, as JSON."""
    stream = child.process.stdout
    if stream is None:
        raise RuntimeError(f"{child.name} was not started with a stdout pipe")
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        line = stream.readline()
        if line:
            parsed: dict[str, Any] = json.loads(line)
            return parsed
        if not child.alive():
            break
    raise RuntimeError(f"{child.name} did not start: see {child.log}")
