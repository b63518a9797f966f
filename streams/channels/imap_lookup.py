"""The smtp channel's lookup: IMAP SEARCH by Message-ID in an archive mailbox.

Relays commonly copy everything they accept into a mailbox of their own (an automatic
BCC, a journal). Finding OUR copy of ``Message-ID: <KEY@DOMAIN>`` there proves the relay
accepted the logical event; its UID (with the mailbox's UIDVALIDITY) is the evidence. A
Message-ID is public, so a copy is ours only when its ``X-Ledger-Origin`` header verifies
(streams/channels/mail_origin.py); others with the same Message-ID are named, never taken.
Not finding ours is "not found", evidence only when repeated (the state machine asks
twice, spaced apart).

The standard library's ``imaplib`` runs in a thread: every socket operation is bounded by
the deadline, and the whole lookup by ``asyncio.wait_for`` on top.
"""

from __future__ import annotations

import asyncio
import imaplib
import re
import ssl
from email import policy
from email.parser import BytesHeaderParser

from events.channels.mail import SmtpSettings
from events.outcomes import LookupOutcome
from streams.channels.base import LookupResult
from streams.channels.mail_origin import ORIGIN_HEADER, sealed_by_us

# Copies with one Message-ID whose headers one lookup reads; more is an error, never
# "not found" (ours could be among those not read).
MAX_COPIES = 200
_FETCH = f"(UID BODY.PEEK[HEADER.FIELDS (MESSAGE-ID {ORIGIN_HEADER.upper()})])"
_UID = re.compile(rb"\bUID (\d+)")


class ArchiveLookup:
    """Searches the configured archive mailbox (read-only) for one Message-ID."""

    def __init__(self, config: SmtpSettings, *, deadline_s: float) -> None:
        if config.imap_host is None or config.imap_username is None:
            raise ValueError("an archive lookup needs imap_host and imap_username")
        if config.origin_key is None:
            raise ValueError("an archive lookup needs origin_key")
        self._config = config
        self._key = config.origin_key
        self._deadline_s = deadline_s
        self.where = (
            f"IMAP {config.imap_host}:{config.imap_port_used} mailbox {config.imap_mailbox!r}"
        )

    async def find(self, message_id: str) -> LookupResult:
        """Look ``message_id`` (with its angle brackets) up; never raises for IMAP trouble."""
        try:
            return await asyncio.wait_for(
                asyncio.to_thread(self._search, message_id), self._deadline_s
            )
        except TimeoutError:
            return LookupResult(
                LookupOutcome.LOOKUP_ERROR,
                f"{self.where}: no answer within the {self._deadline_s:g}s deadline",
            )
        except (imaplib.IMAP4.error, OSError) as exc:
            return LookupResult(
                LookupOutcome.LOOKUP_ERROR, f"{self.where}: {type(exc).__name__}: {exc}"[:1000]
            )

    def _connect(self) -> imaplib.IMAP4:
        cfg = self._config
        assert cfg.imap_host is not None
        context = ssl.create_default_context()
        if cfg.imap_tls == "implicit":
            return imaplib.IMAP4_SSL(
                cfg.imap_host, cfg.imap_port_used, ssl_context=context, timeout=self._deadline_s
            )
        imap = imaplib.IMAP4(cfg.imap_host, cfg.imap_port_used, timeout=self._deadline_s)
        if cfg.imap_tls == "starttls":
            imap.starttls(context)
        return imap

    def _search(self, message_id: str) -> LookupResult:
        cfg = self._config
        assert cfg.imap_username is not None
        assert cfg.imap_password is not None
        imap = self._connect()
        try:
            imap.login(cfg.imap_username, cfg.imap_password.get_secret_value())
            status, _ = imap.select(f'"{cfg.imap_mailbox}"', readonly=True)
            if status != "OK":
                return LookupResult(
                    LookupOutcome.LOOKUP_ERROR, f"{self.where}: SELECT answered {status}"
                )
            _, validity = imap.response("UIDVALIDITY")
            uidvalidity = (validity[0] or b"?").decode() if validity and validity[0] else "?"
            status, data = imap.uid("SEARCH", "HEADER", "Message-ID", f'"{message_id}"')
            if status != "OK":
                return LookupResult(
                    LookupOutcome.LOOKUP_ERROR, f"{self.where}: SEARCH answered {status}"
                )
            uids = [u.decode() for u in (data[0] or b"").split()] if data else []
            if len(uids) > MAX_COPIES:
                return LookupResult(
                    LookupOutcome.LOOKUP_ERROR,
                    f"{self.where}: {len(uids)} messages with Message-ID {message_id}, more "
                    f"than the {MAX_COPIES} one lookup checks",
                )
            ours, others = self._ours(imap, uids, message_id) if uids else ([], [])
        finally:
            try:
                imap.logout()
            except (imaplib.IMAP4.error, OSError):
                imap.shutdown()
        not_ours = (
            f"; {len(others)} with it but without our {ORIGIN_HEADER}, not taken: UIDs "
            f"{' '.join(others[:10])}"
            if others
            else ""
        )
        if not ours:
            return LookupResult(
                LookupOutcome.NOT_FOUND,
                f"{self.where}: no message of ours with Message-ID {message_id}{not_ours}"[:1000],
            )
        first = ours[0]
        return LookupResult(
            LookupOutcome.FOUND,
            f"{self.where}: Message-ID {message_id} at UID {first} (UIDVALIDITY {uidvalidity}), "
            f"{ORIGIN_HEADER} verified"
            + (f", {len(ours)} copies: UIDs {' '.join(ours[:10])}" if len(ours) > 1 else "")
            + not_ours,
            provider_message_id=f"{cfg.imap_mailbox}/{uidvalidity}/{first}",
            provider_status="archived",
            delivered=True,
        )

    def _ours(
        self, imap: imaplib.IMAP4, uids: list[str], message_id: str
    ) -> tuple[list[str], list[str]]:
        """Split ``uids`` into the copies our seal verifies and the others, by UID."""
        status, data = imap.uid("FETCH", ",".join(uids), _FETCH)
        if status != "OK":
            raise imaplib.IMAP4.error(f"FETCH answered {status}")
        headers: dict[str, bytes] = {}
        # Each message: (b'N (UID U BODY[...] {n}', literal), then b')' (or b' UID U)').
        for index, item in enumerate(data):
            if not isinstance(item, tuple):
                continue
            found = _UID.search(item[0])
            if found is None and index + 1 < len(data) and isinstance(data[index + 1], bytes):
                found = _UID.search(data[index + 1])
            if found is not None:
                headers[found.group(1).decode()] = item[1]
        parser = BytesHeaderParser(policy=policy.compat32)
        ours: list[str] = []
        others: list[str] = []
        for uid in sorted(uids, key=int):
            parsed = parser.parsebytes(headers.get(uid, b""))
            ids = [v.strip() for v in parsed.get_all("Message-ID") or []]
            seals = [str(v) for v in parsed.get_all(ORIGIN_HEADER) or []]
            mine = ids == [message_id] and sealed_by_us(self._key, message_id, seals)
            (ours if mine else others).append(uid)
        return ours, others
