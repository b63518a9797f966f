"""Every ``ledger`` command, given bad input, answers with one error line and at most one
hint, the documented exit code (2 bad input, 1 runtime failure), no traceback and no
terminal control codes.

A case runs in the test process, through the console script's own ``ledger.cli.main``,
with the environment, working directory and (captured, not a terminal) output a real
process of it would have: almost every case is refused while parsing, while reading the
settings or by a connection to port 1, in well under the ~1-3 s a CLI start costs here.
The process-wide state ``main`` sets (logging, warnings) is put back after it, and any
other that a case leaves changed fails the case (``process_state``). The cases that say
why run as a real ``python -m ledger`` process: one of each kind of failure, so the real
entry point stays covered, and those a process of their own matters to."""

from __future__ import annotations

import asyncio
import atexit
import contextlib
import logging
import os
import pty
import signal
import socket
import sqlite3
import subprocess
import sys
import threading
import time
import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import typer.main
from typer._click import Context
from typer.core import TyperGroup

from clients.outcome_signing import new_pair
from config.settings import Settings, changed
from events.channels import forget_discovered
from ledger.cli import app, main
from ledger.stack import settings_env

# LEDGER_TEST_CLI_TREE runs the commands from another checkout (the code before a fix),
# so these tests can be shown to fail there: then every case is a real process of it.
CLI_TREE = os.environ.get("LEDGER_TEST_CLI_TREE")
ROOT = Path(CLI_TREE or Path(__file__).resolve().parents[2])
# Nothing listens on port 1: a connection is refused at once (bounded, no waiting).
NO_BROKER = "127.0.0.1:1"
# Outcome signing is on by default: commands that get as far as the broker have a pair.
_SIGNING, _VERIFY = new_pair()
KEYS = {"LEDGER_SIGNING__SIGNING_KEY": _SIGNING, "LEDGER_SIGNING__VERIFY_KEYS": f'["{_VERIFY}"]'}
_OPERATOR, _ = new_pair()
OPERATOR = {"LEDGER_SIGNING__OPERATOR_KEY": _OPERATOR}
SECRET = {"LEDGER_CHANNELS__WEBHOOK_SECRET": "whsec_dGVzdC1jbGktc2VjcmV0LWJ5dGVzLTI0Yg=="}
ESC = "\x1b"


@dataclass(frozen=True)
class Case:
    """Bad input for one command and what the person must see."""

    args: tuple[str, ...]
    code: int
    says: str
    env: dict[str, str] = field(default_factory=dict)
    # Why this case runs as a real ``python -m ledger`` process (empty: in this process).
    process: str = ""


# One case of each kind of failure goes through a real process, so the real entry point
# (python -m ledger, its imports, main's logging and warnings set-up) stays covered.
REAL_ENTRY = "one of each kind through the real entry point: "


ENC = {"LEDGER_ENDPOINTS__ENCRYPTION_KEYS": '["QUFBQUFBQUFBQUFBQUFBQUFBQUFBQUFBQUFBQUFBQUE="]'}
HOOKS = ("--channel", "webhook", "--address", "https://x.test/hooks/")
NO_BROKER_SAYS = f"no Kafka broker answers at {NO_BROKER}"

# By command path. test_every_command_has_cases fails when a new command has none.
CASES: dict[str, list[Case]] = {
    "broker start": [
        Case((), 2, "LEDGER_KAFKA__BROKER_PORT: ", {"LEDGER_KAFKA__BROKER_PORT": "99999"})
    ],
    "broker stop": [Case((), 2, "LEDGER_KAFKA__PARTITIONS: ", {"LEDGER_KAFKA__PARTITIONS": "abc"})],
    "broker status": [
        Case((), 2, "LEDGER_KAFKA__CONTROLLER_PORT: ", {"LEDGER_KAFKA__CONTROLLER_PORT": "x"})
    ],
    "broker certs": [Case((), 2, "Missing argument 'directory'")],
    "broker logs": [
        Case((), 1, "no broker log at "),
        Case(("-n", "0"), 2, "Invalid value for '--lines'"),
    ],
    "topics create": [
        Case((), 1, f"no Kafka broker answers at {NO_BROKER}"),
        Case(
            (),
            2,
            "LEDGER_KAFKA__PARTITIONS: ",
            {"LEDGER_KAFKA__PARTITIONS": "abc"},
            process=REAL_ENTRY + "a setting refused",
        ),
    ],
    "publish": [
        Case(
            ("r1", "--result-hash", "h", "-d", "https://x.test/"),
            2,
            "a delivery needs a channel prefix, like webhook:https://... "
            "(channels: browser, email_api, provider, slack, smtp, webhook)",
        ),
        # Checked before connecting: the answer is about the run id, not the broker.
        Case(("r:1", "--result-hash", "h", "-d", "webhook:https://x.test/"), 2, "run_id must"),
        Case(("r1", "--result-hash", "", "-d", "webhook:https://x.test/"), 2, "result_hash"),
        Case(
            ("r1", "--result-hash", "h", "-d", "webhook:https://x.test/", "--payload", "@DEEP"),
            2,
            "nests too deeply",
        ),
        Case(
            ("r1", "--result-hash", "h", "-d", "webhook:https://x.test/"),
            1,
            f"no Kafka broker answers at {NO_BROKER}",
        ),
        Case(("r1", "--result-hash", "h"), 2, "Missing option '--delivery'"),
        # A payload hash is over RFC 8785 JSON: a number it has no form for is refused,
        # naming the field, before connecting.
        Case(
            (
                "r1",
                "--result-hash",
                "h",
                "-d",
                "webhook:https://x.test/",
                "--payload",
                '{"a": [NaN]}',
            ),
            2,
            "delivery 1: payload.a[0] is nan: RFC 8785 (JCS) JSON has no NaN or Infinity",
        ),
        Case(
            (
                "r1",
                "--result-hash",
                "h",
                "-d",
                "webhook:https://x.test/",
                "--payload",
                '{"id": 9007199254740993}',
            ),
            2,
            "delivery 1: payload.id is 9007199254740993, beyond the exact integer range",
        ),
        Case(
            ("r1", "--result-hash", "h", "-d", "slack:acme/#general"),
            2,
            "Slack channel '#general' is not a conversation ID",
        ),
        Case(
            ("r1", "--result-hash", "h", "-d", "smtp:Ops <ops@example.org>"),
            2,
            "an email recipient is one bare address like name@example.org",
        ),
    ],
    "demo": [Case(("--runs", "0"), 2, "Invalid value for '--runs'")],
    "schema": [
        Case(("--out", "/dev/null"), 2, "--out /dev/null is a file, not a directory"),
        Case(("--out", "/proc/no/such"), 2, "cannot write the schemas into /proc/no/such"),
    ],
    "channels": [
        Case(("--jsn",), 2, "No such option: --jsn"),
        Case((), 2, "LEDGER_CHANNELS__SETTINGS: ", {"LEDGER_CHANNELS__SETTINGS": "{not json"}),
        # A channel's entry is checked by its plugin; the value is never repeated.
        Case(
            ("--json",),
            2,
            "LEDGER_CHANNELS__SETTINGS[webhook]: channel 'webhook' takes no settings",
            {"LEDGER_CHANNELS__SETTINGS": '{"webhook": {"token": "xoxb-not-shown"}}'},
        ),
    ],
    "acls show": [Case(("boss", "u"), 2, "Invalid value for 'role'")],
    "endpoints add": [
        Case(("Bad Id", *HOOKS), 2, "endpoint id 'Bad Id': "),
        Case(("acme",), 2, "add needs --channel and --address"),
        Case(("acme", "--channel", "webhook", "--address", "ftp://x.test/"), 2, "--address is not"),
        Case(("acme", *HOOKS, "--rate-limit", "-1"), 2, "--rate-limit-per-s: "),
        Case(("acme", *HOOKS, "--retry-policy", "{"), 2, "--retry-policy is not JSON"),
        Case(("acme", *HOOKS), 2, "no endpoint encryption key"),
        Case(("acme", *HOOKS, "--secret", "whsec_short"), 2, "--secret: ", ENC),
        Case(("acme", *HOOKS, "--secret", "x", "--no-secret"), 2, "exclude each other", ENC),
        Case(
            ("acme", *HOOKS),
            2,
            "encryption key number 1 is not",
            {"LEDGER_ENDPOINTS__ENCRYPTION_KEYS": '["not-a-key"]'},
        ),
        Case(("acme", *HOOKS), 1, NO_BROKER_SAYS, ENC),
    ],
    "endpoints update": [Case(("acme", "--slo-s", "5"), 1, NO_BROKER_SAYS)],
    "endpoints pause": [
        Case(("acme",), 2, "an operator action needs a reason"),
        Case(("acme", "--reason", "x"), 2, "an operator action needs the operator's name"),
        Case(("acme", "--reason", "x", "--as", "ana"), 1, NO_BROKER_SAYS),
    ],
    "endpoints resume": [Case(("acme",), 1, NO_BROKER_SAYS)],
    "endpoints disable": [Case(("acme",), 2, "an operator action needs a reason")],
    "endpoints enable": [Case(("NO",), 2, "endpoint id 'NO': ")],
    "endpoints rotate-secret": [Case(("acme", "--finish"), 1, NO_BROKER_SAYS)],
    "endpoints reencrypt": [Case((), 2, "no endpoint encryption key")],
    "endpoints list": [Case((), 1, NO_BROKER_SAYS)],
    "endpoints show": [Case(("acme", "--jsn"), 2, "No such option: --jsn")],
    "endpoints history": [Case(("acme",), 1, NO_BROKER_SAYS)],
    "acls grant": [Case(("boss", "u"), 2, "Invalid value for 'role'")],
    "outcome-keys": [Case(("--format", "xml"), 2, "Invalid value for '--format'")],
    "dashboard": [Case(("--port", "99999"), 2, "Invalid value for '--port'")],
    "api": [
        Case(("--port", "99999"), 2, "Invalid value for '--port'"),
        Case(("--dsn", "mysql://db/x"), 2, "must be sqlite:///path or postgresql://"),
        Case(
            ("--dsn", "postgresql://postgres@127.0.0.1:1/x"),
            1,
            "the idempotency database did not answer (cannot connect to",
            process=REAL_ENTRY + "a runtime failure, in a server with its signal handlers",
        ),
        Case((), 1, NO_BROKER_SAYS, {"LEDGER_API__PORT": "0"}),
        Case(("--with-dashboard",), 1, "no projection at"),
    ],
    "mcp": [
        Case(("--http", "--port", "99999"), 2, "Invalid value for '--port'"),
        Case(("--port", "8790"), 2, "--port goes with --http"),
        Case(("--agent", "a bot"), 2, "--agent must be 1-200 letters"),
        Case(("--operator", " "), 2, "an operator action needs the operator's name"),
    ],
    "api-keys create": [
        Case(("--agent", ""), 2, "--agent must be 1-200 characters"),
        Case(("--agent", "bot"), 1, NO_BROKER_SAYS),
    ],
    "api-keys list": [Case((), 1, NO_BROKER_SAYS)],
    "api-keys revoke": [Case(("0123456789abcdef",), 1, NO_BROKER_SAYS)],
    "fake-provider": [
        Case(("--port", "99999"), 2, "Invalid value for '--port'"),
        Case(("--timeout-pct", "200"), 2, "Invalid value for '--timeout-pct'"),
        Case(("--delay", "-1"), 2, "Invalid value for '--delay'"),
        Case(("--hooks", "fancy"), 2, "Invalid value for '--hooks'"),
    ],
    "fake-form": [
        Case(("--port", "99999"), 2, "Invalid value for '--port'"),
        Case(("--slow-pct", "101"), 2, "Invalid value for '--slow-pct'"),
        Case(("--crash-pct", "60", "--error-pct", "60"), 2, "add up to more than 100"),
        Case(("--delay", "-1"), 2, "Invalid value for '--delay'"),
    ],
    "fake-slack": [
        Case(("--port", "99999"), 2, "Invalid value for '--port'"),
        Case(("--channel", "general"), 2, "'general' is not a Slack conversation ID"),
        Case(("--ratelimit-pct", "101"), 2, "Invalid value for '--ratelimit-pct'"),
        Case(
            (),
            2,
            "LEDGER_CHANNELS__SETTINGS: not valid JSON",
            {"LEDGER_CHANNELS__SETTINGS": "xoxb"},
        ),
        Case(
            (),
            2,
            "LEDGER_CHANNELS__SETTINGS[slack].tokens: Value error, workspace 'a b' must be",
            {"LEDGER_CHANNELS__SETTINGS": '{"slack": {"tokens": {"a b": "xoxb-1"}}}'},
        ),
    ],
    "fake-mail": [
        Case(("--port", "99999"), 2, "Invalid value for '--port'"),
        Case(("--imap-port", "-1"), 2, "Invalid value for '--imap-port'"),
        Case(("--drop-pct", "101"), 2, "Invalid value for '--drop-pct'"),
        Case(("--tempfail-pct", "-5"), 2, "Invalid value for '--tempfail-pct'"),
    ],
    "fake-email-api": [
        Case(("--port", "99999"), 2, "Invalid value for '--port'"),
        Case(("--deliver-after", "-1"), 2, "Invalid value for '--deliver-after'"),
        Case(
            (),
            2,
            "LEDGER_CHANNELS__SETTINGS[email_api]: Value error, api_url, api_key and from_address",
            {"LEDGER_CHANNELS__SETTINGS": '{"email_api": {"api_url": "https://mail.example"}}'},
        ),
        Case(
            (),
            2,
            "LEDGER_CHANNELS__SETTINGS[email_api].from_address",
            {
                "LEDGER_CHANNELS__SETTINGS": '{"email_api": {"api_url": "https://m.example", '
                '"api_key": "k", "from_address": "Ledger <l@example.org>"}}'
            },
        ),
        Case((), 2, "LEDGER_CHANNELS__SETTINGS", {"LEDGER_CHANNELS__SETTINGS": "{not json"}),
    ],
    "init": [Case((), 2, "LEDGER_KAFKA__PARTITIONS: ", {"LEDGER_KAFKA__PARTITIONS": "abc"})],
    "project": [
        Case((), 1, f"no Kafka broker answers at {NO_BROKER}", KEYS),
        Case((), 2, "outcome signing is on but this reader has no verify key"),
    ],
    "rebuild": [
        Case((), 2, "Missing option '--into'"),
        Case(
            ("--into", "sqlite:///DATA/r.sqlite3"),
            1,
            f"no Kafka broker answers at {NO_BROKER}",
            KEYS,
            # A thread of asyncio's child watcher can outlive the case in this process.
            process="starts its rebuild workers as child processes",
        ),
        Case(
            ("--into", "sqlite:///DATA/r.sqlite3", "--workers", "1"),
            2,
            "outcome signing is on but this reader has no verify key",
        ),
    ],
    "verify": [Case((), 1, "no projection at sqlite:///")],
    "status": [Case((), 1, "no projection at sqlite:///")],
    "run": [Case((), 2, "Missing argument 'run_id'"), Case(("r1",), 1, "no projection at")],
    "resolve": [
        Case(("k", "--reason", "r", "--as", "me"), 2, "resolve needs exactly one outcome, got no"),
        Case(
            ("k", "--delivered", "--abandon", "--reason", "r", "--as", "me"),
            2,
            "resolve needs exactly one outcome, got more than one",
        ),
        Case(
            ("k", "--not-delivered", "--receiver-id", "x", "--reason", "r", "--as", "me"),
            2,
            "--receiver-id goes with --delivered only",
        ),
        Case(("k", "--delivered", "--reason", "r"), 2, "an operator action needs the operator's"),
        Case(("k", "--delivered", "--as", "me"), 2, "an operator action needs a reason"),
        Case(("k", "--delivered", "--as", "me", "--reason", " "), 2, "needs a reason"),
        Case(
            ("k", "--delivered", "--reason", "r"),
            2,
            "the operator's name must be 1-200 printable characters",
            {"LEDGER_OPERATOR": "a\tb"},
        ),
        Case(
            ("k", "--delivered", "--reason", "r", "--as", "me"),
            2,
            "acting as an operator needs the operator signing key, and there is none here",
        ),
        Case(
            ("k", "--abandon", "--reason", "r"),
            1,
            "no projection at sqlite:///",
            OPERATOR | {"LEDGER_OPERATOR": "me"},
        ),
    ],
    "budgets set": [
        Case(
            ("a", "--window", "1h", "--reason", "r", "--as", "me"), 2, "budgets set needs --limit"
        ),
        Case(("a", "--limit", "5", "--reason", "r", "--as", "me"), 2, "budgets set needs --window"),
        Case(
            ("a", "--limit", "5", "--window", "1w", "--reason", "r", "--as", "me"),
            2,
            "window '1w' is not a number and a unit (s, m, h, d)",
        ),
        Case(
            ("a", "--limit", "-1", "--window", "1h", "--reason", "r", "--as", "me"),
            2,
            "--limit must be between 0 and",
        ),
        Case(("a", "--limit", "5", "--window", "1h", "--as", "me"), 2, "needs a reason"),
        Case(("a", "--limit", "5", "--window", "1h", "--reason", "r"), 2, "the operator's name"),
        Case(
            ("a", "--limit", "5", "--window", "1h", "--channel", " ", "--reason", "r", "--as", "x"),
            2,
            "--channel must be 1-64 characters",
        ),
        Case(
            ("a", "--limit", "5", "--window", "1h", "--reason", "r", "--as", "me"),
            1,
            "no Kafka broker answers at 127.0.0.1:1",
            OPERATOR,
        ),
    ],
    "budgets clear": [
        Case((), 2, "Missing argument 'agent'"),
        Case(("a",), 2, "an operator action needs the operator's name"),
        Case(("a", "--as", "me"), 1, "no Kafka broker answers at 127.0.0.1:1"),
    ],
    "budgets show": [Case((), 1, "no Kafka broker answers at 127.0.0.1:1")],
    "budgets release": [
        Case(("a", "--count", "0", "--reason", "r", "--as", "me"), 2, "--count must be between 1"),
        Case(("a", "--count", "1", "--as", "me"), 2, "an operator action needs a reason"),
        Case(("a", "--count", "1", "--reason", "r", "--as", "me"), 1, "no Kafka broker answers"),
    ],
    "redrive": [
        Case(
            ("--reason", "r", "--as", "me"),
            2,
            "redrive needs a selection",
            process=REAL_ENTRY + "a command's own usage error",
        ),
        Case(
            ("--run", "r1", "--since", "yesterday", "--reason", "r", "--as", "me"),
            2,
            "--since 'yesterday' is not an ISO-8601 time",
        ),
        Case(
            ("--since", "2026-02-01", "--until", "2026-01-01", "--reason", "r", "--as", "me"),
            2,
            "--since must be before --until",
        ),
        Case(("--state", "SENT", "--reason", "r", "--as", "me"), 2, "Invalid value for '--state'"),
        Case(("--run", "r1", "--limit", "0"), 2, "Invalid value for '--limit'"),
        Case(("--run", "r1", "--reason", "r"), 2, "an operator action needs the operator's name"),
        Case(("--run", "r1", "--as", "me"), 2, "an operator action needs a reason"),
        Case(
            ("--run", "r1", "--reason", "r", "--as", "me"),
            2,
            "acting as an operator needs the operator signing key",
        ),
        # A dry run appends nothing: it needs no key, only the projection.
        Case(("--run", "r1", "--reason", "r", "--as", "me", "--dry-run"), 1, "no projection at"),
    ],
    "replay": [
        Case(
            ("--since", "2026-02-01", "--until", "2026-01-01"),
            2,
            "--since must be before --until",
        ),
        Case(("--from-offset", "5", "--to-offset", "5"), 2, "--from-offset must be below"),
        Case(("--since", "yesterday"), 2, "--since 'yesterday' is not an ISO-8601 time"),
        Case(("--type", "nope"), 2, "unknown event type 'nope'"),
        Case(("-p", "-1"), 2, "Invalid value for '--partition'"),
        Case(("--format", "parquet"), 2, "parquet needs a file"),
        Case(("-o", "DATA/no/such/dir/out.csv", "-f", "csv"), 2, "cannot write "),
        Case((), 1, f"no Kafka broker answers at {NO_BROKER}"),
    ],
    "worker": [
        Case(
            (),
            1,
            f"no Kafka broker answers at {NO_BROKER}",
            SECRET | KEYS,
            process=REAL_ENTRY + "a broker that does not answer (after faust's app is built)",
        ),
        Case((), 2, "outcome signing is on but this worker has no signing key", SECRET),
        Case((), 2, "webhook secret is empty", {"LEDGER_CHANNELS__WEBHOOK_SECRET": ""} | KEYS),
        Case(("-l", "LOUD"), 2, "'LOUD' is not a log level"),
        Case(("--metrics-port", "99999"), 2, "Invalid value for '--metrics-port'"),
        Case(
            (),
            2,
            "invalid settings: LEDGER_WORKER__LEASE_S=5 must exceed "
            "LEDGER_CHANNELS__SEND_DEADLINE_S=10",
            {"LEDGER_WORKER__LEASE_S": "5", "LEDGER_CHANNELS__SEND_DEADLINE_S": "10"},
        ),
        # Someone else owns secret parsing; whatever it refuses must be one line.
        Case((), 2, "", {"LEDGER_CHANNELS__WEBHOOK_SECRET": "whsec_%%%"} | KEYS),
    ],
}


def command_paths() -> list[str]:
    """Every leaf command of the typer app, as ``"group command"`` paths."""
    found: list[str] = []

    def walk(command: object, context: Context, prefix: tuple[str, ...]) -> None:
        if not isinstance(command, TyperGroup):
            found.append(" ".join(prefix))
            return
        for name in command.list_commands(context):
            child = command.get_command(context, name)
            assert child is not None, f"{name} is listed and not found"
            walk(child, Context(child, parent=context, info_name=name), (*prefix, name))

    root = typer.main.get_command(app)
    walk(root, Context(root, info_name="ledger"), ())
    return sorted(found)


def ledger(
    args: list[str], env: dict[str, str], *, python: list[str] | None = None
) -> subprocess.CompletedProcess[str]:
    """Run ``python -m ledger ARGS`` from this checkout (its modules win), bounded."""
    return subprocess.run(
        [*(python or [sys.executable, "-m", "ledger"]), *args],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=90,
        check=False,
    )


def base_env(tmp: Path, **extra: str) -> dict[str, str]:
    """An environment with no broker reachable and a data dir of the test's own (no
    trace exporter: tracing, once configured, stays for the rest of a process)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("LEDGER_", "OTEL_"))}
    env.update(
        LEDGER_KAFKA__BOOTSTRAP_SERVERS=NO_BROKER, LEDGER_DATA_DIR=str(tmp / "data"), **extra
    )
    env.pop("FORCE_COLOR", None)
    return env


def process_state() -> dict[str, Any]:
    """What a command could change for the rest of a process and ``main`` does not: an
    in-process case must leave each as it found it (else it needs a process of its own)."""
    loggers = {"": logging.getLogger()} | {
        name: found
        for name, found in logging.Logger.manager.loggerDict.items()
        if isinstance(found, logging.Logger)
    }
    return {
        "signal handlers": {sig: signal.getsignal(sig) for sig in signal.valid_signals()},
        "event loop policy": asyncio.get_event_loop_policy(),
        "threads": set(threading.enumerate()),
        "environment": dict(os.environ),
        "working directory": os.getcwd(),
        "standard streams": (sys.stdin, sys.stdout, sys.stderr),
        "hooks": (sys.excepthook, sys.unraisablehook, threading.excepthook),
        "recursion limit": sys.getrecursionlimit(),
        "socket timeout": socket.getdefaulttimeout(),
        "atexit callbacks": atexit._ncallbacks(),
        "logging disabled": logging.root.manager.disable,
        "loggers": {
            name: (each.level, list(each.handlers), each.propagate, each.disabled)
            for name, each in loggers.items()
        },
    }


def _thread_loop() -> asyncio.AbstractEventLoop | None:
    # The loop set for this thread, read without making one (get_event_loop would).
    loop = getattr(getattr(asyncio.get_event_loop_policy(), "_local", None), "_loop", None)
    assert loop is None or isinstance(loop, asyncio.AbstractEventLoop)
    return loop


@contextmanager
def as_a_process() -> Iterator[list[warnings.WarningMessage]]:
    """Around an in-process ``main``: Python's default warning filters (not pytest's;
    the warnings a process would print are yielded), the root logger without pytest's
    handlers (so ``main``'s ``basicConfig`` writes to the captured stderr, as in a
    process), channel discovery not done yet; afterwards, what ``main`` set up (typer's
    app its ``sys.excepthook``) and the thread's event loop (``asyncio.run`` unsets it)
    put back, and every other ``process_state`` checked unchanged."""
    root, aiokafka = logging.getLogger(), logging.getLogger("aiokafka")
    handlers, level, aiokafka_level = list(root.handlers), root.level, aiokafka.level
    excepthook = sys.excepthook
    loop = _thread_loop()
    forget_discovered()
    before = process_state()
    try:
        with warnings.catch_warnings(record=True) as shown:
            warnings.resetwarnings()
            for category in (
                DeprecationWarning,
                PendingDeprecationWarning,
                ImportWarning,
                ResourceWarning,
            ):
                warnings.simplefilter("ignore", category, append=True)
            root.handlers = []
            yield shown
    finally:
        for added in root.handlers:
            added.close()
        root.handlers = handlers
        root.setLevel(level)
        aiokafka.setLevel(aiokafka_level)
        sys.excepthook = excepthook
        asyncio.set_event_loop(loop)
    changed = state_changes(before, process_state())
    assert not changed, f"the command changed (before, after) {changed}: run it in a process"


def state_changes(before: dict[str, Any], after: dict[str, Any]) -> dict[str, Any]:
    """Each ``process_state`` that differs, as (before, after); of the signal handlers and
    loggers, only the entries that differ."""
    changed: dict[str, Any] = {}
    for name, was in before.items():
        now = after[name]
        if name in ("signal handlers", "loggers"):
            differ = {key: (was.get(key), now[key]) for key in now if now[key] != was.get(key)}
            # A logger first made now (by a first import) the way a library makes one (no
            # level, no handler but a NullHandler) is not a change.
            for key in [key for key in differ if key not in was and name == "loggers"]:
                level, handlers, propagate, disabled = now[key]
                plain = all(type(handler) is logging.NullHandler for handler in handlers)
                if (level, plain, propagate, disabled) == (logging.NOTSET, True, True, False):
                    del differ[key]
            if differ:
                changed[name] = differ
        elif now != was:
            changed[name] = (was, now)
    return changed


def ledger_here(
    args: list[str],
    env: dict[str, str],
    capfd: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> subprocess.CompletedProcess[str]:
    """``ledger ARGS`` in this process through ``ledger.cli.main``, with exactly ``env``
    as its environment and this checkout as its working directory, as ``ledger`` runs."""
    for name in os.environ.keys() - env.keys():
        monkeypatch.delenv(name)
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    monkeypatch.chdir(ROOT)
    monkeypatch.setattr(sys, "argv", ["ledger", *args])
    capfd.readouterr()
    with as_a_process() as shown, pytest.raises(SystemExit) as exited:
        main()
    out, err = capfd.readouterr()
    # What a process would have printed on stderr as it happened (``main``'s own format
    # for renamed settings is printed, not recorded).
    for each in shown:
        err += warnings.formatwarning(
            each.message, each.category, each.filename, each.lineno, each.line
        )
    code = exited.value.code
    return subprocess.CompletedProcess(sys.argv, code if isinstance(code, int) else 1, out, err)


def assert_one_line(done: subprocess.CompletedProcess[str], code: int, says: str) -> None:
    """Exit ``code``; stderr is ``error: ...`` (containing ``says``) and at most a hint."""
    shown = f"exit {done.returncode}\nstdout: {done.stdout!r}\nstderr: {done.stderr!r}"
    assert done.returncode == code, shown
    lines = done.stderr.splitlines()
    assert 1 <= len(lines) <= 2, shown
    assert lines[0].startswith("error: "), shown
    assert says in lines[0], shown
    if len(lines) == 2:
        assert lines[1].startswith("hint: "), shown
    assert "Traceback" not in done.stderr + done.stdout, shown
    assert ESC not in done.stderr + done.stdout, shown


def test_every_command_has_cases() -> None:
    assert sorted(CASES) == command_paths()


ALL_CASES = [
    pytest.param(path, case, id=f"{path}:{i}")
    for path, cases in CASES.items()
    for i, case in enumerate(cases)
]


# In this process, a case that waits on something is stopped here (a real process is
# stopped by ``ledger``'s own 90 s).
@pytest.mark.timeout(120)
@pytest.mark.parametrize(("path", "case"), ALL_CASES)
def test_bad_input_is_one_line_and_a_hint(
    path: str,
    case: Case,
    tmp_path: Path,
    capfd: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    deep = tmp_path / "deep.json"
    deep.write_text("[" * 5000 + "]" * 5000)
    args = [a.replace("@DEEP", f"@{deep}").replace("DATA/", f"{tmp_path}/") for a in case.args]
    env = base_env(tmp_path, **case.env)
    if case.process or CLI_TREE:
        done = ledger([*path.split(), *args], env)
    else:
        done = ledger_here([*path.split(), *args], env, capfd, monkeypatch)
    assert_one_line(done, case.code, case.says)


@pytest.mark.parametrize(
    ("env", "code", "says"),
    [(KEYS, 1, NO_BROKER_SAYS), ({}, 2, "outcome signing is on but this reader has no verify key")],
    ids=["no-broker", "no-verify-key"],
)
def test_a_refused_rebuild_leaves_no_tables_behind(
    env: dict[str, str],
    code: int,
    says: str,
    tmp_path: Path,
    capfd: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Exit 2 says nothing was done: the second try is refused for the same reason, not
    because the first left ledger tables (which only ``--replace`` would clear)."""
    into = tmp_path / "r.sqlite3"
    args = ["rebuild", "--into", f"sqlite:///{into}", "--workers", "1"]
    for _ in range(2):
        if CLI_TREE:
            done = ledger(args, base_env(tmp_path, **env))
        else:
            done = ledger_here(args, base_env(tmp_path, **env), capfd, monkeypatch)
        assert_one_line(done, code, says)
    with contextlib.closing(sqlite3.connect(into)) as db:
        assert db.execute("SELECT name FROM sqlite_master WHERE type = 'table'").fetchall() == []


@pytest.mark.timeout(120)
@pytest.mark.parametrize("path", command_paths())
def test_an_unknown_option_is_a_usage_error_everywhere(
    path: str, tmp_path: Path, capfd: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """In this process (the option is refused while parsing, before any command runs):
    49 commands, a CLI start each no more. One command goes through a real process below."""
    args, env = [*path.split(), "--no-such-option"], base_env(tmp_path)
    done = ledger(args, env) if CLI_TREE else ledger_here(args, env, capfd, monkeypatch)
    assert_one_line(done, 2, "No such option: --no-such-option")
    assert done.stderr.splitlines()[1] == f"hint: see 'ledger {path} --help'"


def test_an_unknown_option_is_a_usage_error_in_a_real_process(tmp_path: Path) -> None:
    done = ledger(["replay", "--no-such-option"], base_env(tmp_path))
    assert_one_line(done, 2, "No such option: --no-such-option")
    assert done.stderr.splitlines()[1] == "hint: see 'ledger replay --help'"


def test_version_prints_the_package_version(tmp_path: Path) -> None:
    from importlib.metadata import version

    done = ledger(["--version"], base_env(tmp_path))
    assert done.returncode == 0, done.stderr
    assert done.stdout == f"delivery-ledger {version('delivery-ledger')}\n"


def test_parquet_without_pyarrow_says_how_to_install_it(tmp_path: Path) -> None:
    # pyarrow is installed here (dev): block its import as if it were not.
    blocked = (
        "import sys; sys.modules['pyarrow'] = None; sys.modules['pyarrow.parquet'] = None; "
        "sys.argv[0] = 'ledger'; from ledger.cli import main; main()"
    )
    done = ledger(
        ["replay", "--format", "parquet", "-o", str(tmp_path / "out.parquet")],
        base_env(tmp_path),
        python=[sys.executable, "-c", blocked],
    )
    assert_one_line(done, 2, "parquet output needs pyarrow: pip install 'delivery-ledger[parquet]'")
    assert not (tmp_path / "out.parquet").exists()


# Against the real broker ------------------------------------------------------------


def test_filters_that_match_nothing_say_so(settings: Settings) -> None:
    env = settings_env(settings)
    done = ledger(["replay", "--key", "zz"], env)
    assert done.returncode == 0, done.stderr
    assert done.stdout == ""
    assert done.stderr.splitlines() == [
        "no events match the filters",
        "hint: --key takes a whole idempotency key (64 hex characters; 'ledger run RUN_ID' "
        "shows them)",
    ]
    everything = ledger(["replay", "--json"], env)
    assert everything.returncode == 0, everything.stderr
    assert everything.stdout == ""
    assert everything.stderr == (
        f"no events in {settings.kafka.topic_runs}, {settings.kafka.topic_deliveries}\n"
    )


def test_a_partition_beyond_the_topics_is_a_usage_error(settings: Settings) -> None:
    done = ledger(["replay", "-p", "99"], settings_env(settings))
    assert_one_line(
        done,
        2,
        f"partition 99 does not exist ({settings.kafka.topic_runs} has 4, "
        f"{settings.kafka.topic_deliveries} has 4)",
    )
    assert done.stderr.splitlines()[1] == "hint: partitions are numbered from 0 to 3"


def run_worker(
    env: dict[str, str], tmp: Path, name: str, loglevel: str, ready: str, on_tty: bool
) -> str:
    """Start ``ledger worker``, wait until ``ready`` is in its output (at most 60 s), stop
    it with SIGTERM; return what it wrote on stdout and stderr (stderr to a file)."""
    log, out = tmp / f"{name}.err", tmp / f"{name}.out"
    master, slave = pty.openpty() if on_tty else (-1, -1)
    with open(log, "wb") as err_file, open(out, "wb") as out_file:
        worker = subprocess.Popen(
            [sys.executable, "-m", "ledger", "worker", "--name", name, "-l", loglevel],
            cwd=ROOT,
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=slave if on_tty else out_file,
            stderr=err_file,
        )

    def written() -> str:
        return log.read_text(errors="replace") + out.read_text(errors="replace")

    try:
        deadline = time.monotonic() + 60
        while ready not in written():
            assert worker.poll() is None, written()
            assert time.monotonic() < deadline, f"worker not ready: {written()[-2000:]}"
            time.sleep(0.5)
        # faust's spinner (when it has one) starts on the first log record after set-up.
        time.sleep(3)
    finally:
        worker.send_signal(signal.SIGTERM)
        worker.wait(timeout=60)
        if on_tty:
            os.close(master)
            os.close(slave)
    return written()


def test_worker_logs_have_no_terminal_codes_off_a_terminal(
    settings: Settings, tmp_path: Path
) -> None:
    """Logs into a file while stdout is a terminal: no colour codes in the file. Neither
    stream a terminal: no spinner (cursor) codes in either."""
    env = settings_env(changed(settings, {"data_dir": tmp_path / "data"}))
    outputs = {
        "tty": run_worker(env, tmp_path, "tty", "INFO", "[^Worker]: Ready", on_tty=True),
        "file": run_worker(env, tmp_path, "file", "WARNING", "ledger worker", on_tty=False),
    }
    for where, text in outputs.items():
        assert ESC not in text, (where, [line for line in text.splitlines() if ESC in line][:5])
