"""The smtp channel's lookup: IMAP SEARCH by Message-ID in an archive mailbox.

Relays commonly copy everything they accept into a mailbox of their own (an automatic
BCC, a journal). Finding ``Message-ID: <KEY@DOMAIN>`` there proves the relay accepted the
logical event; its UID (with the mailbox's UIDVALIDITY) is the evidence. Not finding it is
"not found", evidence only when repeated (the state machine asks twice, spaced apart).

The standard library's ``imaplib`` runs in a thread: every socket operation is bounded by
the deadline, and the whole lookup by ``asyncio.wait_for`` on top.
"""

from __future__ import annotations

import asyncio
import imaplib
import ssl

from events.channels.mail import SmtpSettings
from streams.channels.base import LookupResult


class ArchiveLookup:
    """Searches the configured archive mailbox (read-only) for one Message-ID."""

    def __init__(self, config: SmtpSettings, *, deadline_s: float) -> None:
        if config.imap_host is None or config.imap_username is None:
            raise ValueError("an archive lookup needs imap_host and imap_username")
        self._config = config
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
                "lookup_error", f"{self.where}: no answer within the {self._deadline_s:g}s deadline"
            )
        except (imaplib.IMAP4.error, OSError) as exc:
            return LookupResult("lookup_error", f"{self.where}: {type(exc).__name__}: {exc}"[:1000])

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
                return LookupResult("lookup_error", f"{self.where}: SELECT answered {status}")
            _, validity = imap.response("UIDVALIDITY")
            uidvalidity = (validity[0] or b"?").decode() if validity and validity[0] else "?"
            status, data = imap.uid("SEARCH", "HEADER", "Message-ID", f'"{message_id}"')
            if status != "OK":
                return LookupResult("lookup_error", f"{self.where}: SEARCH answered {status}")
            uids = [u.decode() for u in (data[0] or b"").split()] if data else []
        finally:
            try:
                imap.logout()
            except (imaplib.IMAP4.error, OSError):
                imap.shutdown()
        if not uids:
            return LookupResult(
                "not_found", f"{self.where}: no message with Message-ID {message_id}"
            )
        first = uids[0]
        return LookupResult(
            "found",
            f"{self.where}: Message-ID {message_id} at UID {first} (UIDVALIDITY {uidvalidity})"
            + (f", {len(uids)} copies: UIDs {' '.join(uids[:10])}" if len(uids) > 1 else ""),
            provider_message_id=f"{cfg.imap_mailbox}/{uidvalidity}/{first}",
            provider_status="archived",
            delivered=True,
        )
