"""Real mail servers for the smtp channel on 127.0.0.1: an SMTP relay and its IMAP archive.

* ``MailServer``: aiosmtpd (a real SMTP server) whose handler delivers every accepted
  message into a Maildir and, like a relay's journal, a copy into an archive Maildir. It
  does NOT dedupe: a second message with the same Message-ID is a second file. Faults per
  recipient on command: drop the connection after DATA (the message was stored), answer
  421 or 550 at RCPT, 451 after the message, delay the reply after DATA; and a seeded
  random mix (``MailFaultMix``): a share of messages dropped after DATA, of RCPTs
  answered 421.
* ``Dovecot``: Debian's dovecot-imapd over the archive Maildir, unprivileged, with its own
  config in a temporary directory, plaintext login on loopback, one passwd-file user.
  ``scripts/dovecot`` installs it; ``DovecotMissing`` says so when it is not there.

``ledger fake-mail`` runs both; the tests start them per test (tests/fixtures/mail.py).
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import getpass
import mailbox
import os
import random
import shutil
import signal
import socket
import subprocess
import tempfile
import threading
import time
from dataclasses import dataclass, field
from email import message_from_bytes
from email.message import Message
from pathlib import Path
from typing import Any

from aiosmtpd.controller import Controller
from aiosmtpd.smtp import SMTP, Envelope, Session
from pydantic import Secret

from config.settings import Settings, changed
from events.errors import LedgerError

DOVECOT = "/usr/sbin/dovecot"
IMAP_USER = "journal"
# The tests' password on loopback; `ledger fake-mail` makes a random one per start.
IMAP_PASSWORD = "journal-pw-for-tests"  # noqa: S105
IMAP_MAILBOX = "INBOX"  # dovecot serves the archive Maildir as its INBOX
FROM = "ledger@ledger.test"
DOMAIN = "ledger.test"
# The tests' smtp origin_key (the X-Ledger-Origin HMAC key); `ledger fake-mail` makes a
# random one per start.
ORIGIN_KEY = "origin-key-for-tests-0123456789"


def free_port() -> int:
    """A free port on 127.0.0.1 below 32768 (the kernel's ephemeral range starts there)."""
    for _ in range(200):
        port = random.randrange(20000, 32000)  # noqa: S311 - a port, not a secret
        with socket.socket() as probe:
            try:
                probe.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port
    raise RuntimeError("no free port below 32768")


def _die_with_parent() -> None:
    # Not Linux: no prctl; stop() still ends dovecot.
    with contextlib.suppress(OSError):
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG


def _open_tree(path: Path) -> None:
    """Let the (unprivileged) dovecot read and rename what the test process writes."""
    # dovecot (as nobody under root) renames files in the archive's new/ and cur/: a
    # loopback fake's temporary Maildir, readable by design.
    for root, dirs, _ in os.walk(path):
        os.chmod(root, 0o777)  # noqa: S103
        for name in dirs:
            os.chmod(Path(root) / name, 0o777)  # noqa: S103


class DovecotMissing(LedgerError):
    """dovecot-imapd is not installed (a runtime failure: ``scripts/dovecot`` installs it)."""


class DovecotFailed(RuntimeError):
    """dovecot exited or did not answer; ``reason`` is the first error in its log."""

    def __init__(self, message: str, log: str) -> None:
        super().__init__(f"{message}: {log}")
        self.reason = message
        for line in log.splitlines():
            marker = next((m for m in (" Error: ", " Fatal: ") if m in line), None)
            if marker is not None:
                self.reason = line.split(marker, 1)[1].strip()
                break


@dataclass
class Fault:
    """One fault on command, for the next ``times`` transactions of one recipient."""

    kind: str  # drop_after_data | reply_421 | reply_550 | delay_after_data | reply_451_after_data
    times: int = 1
    delay_s: float = 0.0


@dataclass
class Handler:
    """aiosmtpd handler: stores into Maildirs, applies faults by recipient, counts RCPTs."""

    delivered: mailbox.Maildir
    archive: mailbox.Maildir
    archive_dir: Path
    faults: dict[str, list[Fault]] = field(default_factory=dict)
    rcpts: list[str] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)
    mix: MailFaultMix | None = None

    def _draw(self, share: float) -> bool:
        """Whether a random fault of this ``share`` hits this transaction (seeded)."""
        if self.mix is None or share <= 0:
            return False
        with self.lock:
            return self.mix.rng.random() < share

    def _take(self, recipient: str, kinds: set[str]) -> Fault | None:
        with self.lock:
            for fault in self.faults.get(recipient, []):
                if fault.kind in kinds and fault.times > 0:
                    fault.times -= 1
                    return fault
        return None

    async def handle_RCPT(
        self, server: SMTP, session: Session, envelope: Envelope, address: str, options: Any
    ) -> str:
        with self.lock:
            self.rcpts.append(address)
        fault = self._take(address, {"reply_421", "reply_550"})
        if fault is None and self.mix is not None and self._draw(self.mix.tempfail_share):
            fault = Fault("reply_421")
        if fault is not None and fault.kind == "reply_421":
            return "421 4.3.2 try again later (test fault)"
        if fault is not None:
            return "550 5.1.1 no such mailbox (test fault)"
        envelope.rcpt_tos.append(address)
        return "250 OK"

    async def handle_DATA(self, server: SMTP, session: Session, envelope: Envelope) -> str:
        recipient = envelope.rcpt_tos[0]
        fault = self._take(
            recipient, {"drop_after_data", "delay_after_data", "reply_451_after_data"}
        )
        if fault is None and self.mix is not None and self._draw(self.mix.drop_share):
            fault = Fault("drop_after_data")
        if fault is not None and fault.kind == "delay_after_data":
            await asyncio.sleep(fault.delay_s)
        content = envelope.original_content or b""
        with self.lock:
            self.delivered.add(content)
            self.archive.add(content)
            _open_tree(self.archive_dir)
        if fault is not None and fault.kind == "drop_after_data":
            assert isinstance(server.transport, asyncio.Transport)
            server.transport.abort()  # stored, but the client never hears the 250
        if fault is not None and fault.kind == "reply_451_after_data":
            return "451 4.3.0 stored anyway (test fault)"
        return "250 2.0.0 Ok: queued"


@dataclass
class MailFaultMix:
    """Random faults, seeded: shares (0..1) of messages stored and then dropped before
    the reply to DATA, and of RCPTs answered ``421``."""

    seed: int = 0
    drop_share: float = 0.0
    tempfail_share: float = 0.0
    rng: random.Random = field(init=False)

    def __post_init__(self) -> None:
        self.rng = random.Random(self.seed)  # noqa: S311 - a fault mix, not a secret


def _arrival(key: str) -> tuple[float, str]:
    seconds, _, rest = key.partition(".")  # Maildir names start with the delivery time
    return (float(seconds) if seconds.isdigit() else 0.0, rest)


class MailServer:
    """aiosmtpd on 127.0.0.1 with the Maildirs it delivers into (``root/delivered`` and
    ``root/archive``); ``port`` 0 picks a free one below 32768."""

    def __init__(self, root: Path, port: int = 0, mix: MailFaultMix | None = None) -> None:
        self.root = root
        self.delivered_dir = root / "delivered"
        self.archive_dir = root / "archive"
        self.handler = Handler(
            delivered=mailbox.Maildir(self.delivered_dir, create=True),
            archive=mailbox.Maildir(self.archive_dir, create=True),
            archive_dir=self.archive_dir,
            mix=mix,
        )
        _open_tree(self.archive_dir)
        self.port = port or free_port()
        self._controller = Controller(
            self.handler, hostname="127.0.0.1", port=self.port, ready_timeout=10
        )

    def start(self) -> MailServer:
        """Listen; raises ``OSError`` when the port is taken."""
        try:
            self._controller.start()
        except RuntimeError as exc:  # aiosmtpd wraps a failed bind; the cause says why
            cause = exc.__cause__ or exc.__context__
            if isinstance(cause, OSError):
                raise cause from None
            raise
        return self

    def stop(self) -> None:
        """Stop listening (the Maildirs stay)."""
        with contextlib.suppress(Exception):
            self._controller.stop()

    def fault(self, recipient: str, kind: str, times: int = 1, delay_s: float = 0.0) -> None:
        """Apply ``kind`` to the next ``times`` transactions for ``recipient``."""
        with self.handler.lock:
            self.handler.faults.setdefault(recipient, []).append(Fault(kind, times, delay_s))

    def messages(self, message_id: str | None = None) -> list[Message]:
        """The delivered messages (with this Message-ID), oldest first."""
        with self.handler.lock:
            # The stored bytes as they arrived (bytes(message) would refold long headers).
            box = self.handler.delivered
            raw = [box.get_bytes(k) for k in sorted(box.keys(), key=_arrival)]
        found = [message_from_bytes(r) for r in raw]
        return [m for m in found if message_id is None or m["Message-ID"] == message_id]

    def transactions(self, recipient: str) -> int:
        """RCPT commands seen for ``recipient`` (each attempt makes one)."""
        with self.handler.lock:
            return self.handler.rcpts.count(recipient)


class Dovecot:
    """dovecot-imapd over ``maildir``, unprivileged, on 127.0.0.1:``port`` (0: a free one
    below 32768), one user ``username`` with ``password``."""

    def __init__(
        self,
        maildir: Path,
        port: int = 0,
        username: str = IMAP_USER,
        password: str = IMAP_PASSWORD,
    ) -> None:
        self.dir = Path(tempfile.mkdtemp(prefix="ledger-dovecot-", dir="/tmp"))
        self.port = port or free_port()
        self.maildir = maildir
        self.username = username
        self.password = password
        self.process: subprocess.Popen[bytes] | None = None
        self.user = "nobody" if os.geteuid() == 0 else getpass.getuser()

    def _config(self) -> str:
        group = "nogroup" if self.user == "nobody" else self.user
        d = self.dir
        return f"""
base_dir = {d}/run
state_dir = {d}/state
log_path = {d}/dovecot.log
protocols = imap
listen = 127.0.0.1
ssl = no
disable_plaintext_auth = no
auth_mechanisms = plain login
default_internal_user = {self.user}
default_internal_group = {group}
default_login_user = {self.user}
first_valid_uid = 1
# A wrong password is a test case here, not an attack: answer at once.
auth_failure_delay = 0
passdb {{
  driver = passwd-file
  args = scheme=PLAIN username_format=%u {d}/passwd
}}
userdb {{
  driver = static
  args = uid={self.user} gid={group} home={d}/home
}}
mail_location = maildir:{self.maildir}:INDEX=MEMORY
service imap-login {{
  chroot =
  inet_listener imap {{
    address = 127.0.0.1
    port = {self.port}
  }}
  inet_listener imaps {{
    port = 0
  }}
}}
service anvil {{
  chroot =
}}
"""

    def start(self) -> Dovecot:
        """Start ``dovecot -F`` and wait for its IMAP greeting; it dies with this process."""
        if not Path(DOVECOT).exists():
            shutil.rmtree(self.dir, ignore_errors=True)
            raise DovecotMissing(
                f"dovecot-imapd is not installed ({DOVECOT})", "run ./scripts/dovecot"
            )
        for sub in ("run", "state", "home"):
            (self.dir / sub).mkdir()
        (self.dir / "dovecot.conf").write_text(self._config())
        (self.dir / "passwd").write_text(f"{self.username}:{{PLAIN}}{self.password}\n")
        if self.user == "nobody":
            shutil.chown(self.dir, "nobody", "nogroup")
            for path in self.dir.rglob("*"):
                shutil.chown(path, "nobody", "nogroup")
            self.dir.chmod(0o755)
        command = [DOVECOT, "-F", "-c", str(self.dir / "dovecot.conf")]
        # As root: drop to nobody in the child itself (runuser would hold SIGTERM for 2 s).
        drop: dict[str, Any] = (
            {"user": "nobody", "group": "nogroup", "extra_groups": []} if os.geteuid() == 0 else {}
        )
        self.process = subprocess.Popen(
            command,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            preexec_fn=_die_with_parent,  # runs after the drop to nobody, which would clear it
            **drop,
        )
        deadline = time.monotonic() + 15
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                log = self.log()
                self.stop()
                raise DovecotFailed("dovecot exited", log)
            with (
                contextlib.suppress(OSError),
                socket.create_connection(("127.0.0.1", self.port), 0.5) as conn,
            ):
                if conn.recv(100).startswith(b"* OK"):
                    return self
            time.sleep(0.05)
        log = self.log()
        self.stop()
        raise DovecotFailed(f"dovecot did not answer on {self.port}", log)

    def log(self) -> str:
        """The end of dovecot's own log."""
        path = self.dir / "dovecot.log"
        return path.read_text()[-2000:] if path.exists() else ""

    def stop(self) -> None:
        """Stop dovecot and remove its config and state."""
        if self.process is not None and self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(5)
        shutil.rmtree(self.dir, ignore_errors=True)


@dataclass
class MailStack:
    """The SMTP server and, when started with one, the IMAP server over its archive."""

    smtp: MailServer
    imap: Dovecot | None
    origin_key: str = ORIGIN_KEY

    def config(self, **overrides: Any) -> dict[str, Any]:
        """The smtp channel's LEDGER_CHANNELS__SETTINGS entry for this stack."""
        config: dict[str, Any] = {
            "host": "127.0.0.1",
            "port": self.smtp.port,
            "tls": "none",
            "from_address": FROM,
            "message_id_domain": DOMAIN,
            "origin_key": self.origin_key,
        }
        if self.imap is not None:
            config.update(
                imap_host="127.0.0.1",
                imap_port=self.imap.port,
                imap_tls="none",
                imap_username=self.imap.username,
                imap_password=self.imap.password,
                imap_mailbox=IMAP_MAILBOX,
            )
        config.update(overrides)
        return {k: v for k, v in config.items() if v is not None}

    def settings(self, base: Settings, **overrides: Any) -> Settings:
        """``base`` with the smtp channel pointed at this stack."""
        channels = dict(base.channels.settings)
        channels["smtp"] = Secret(self.config(**overrides))
        return changed(base, {"channels.settings": channels})
