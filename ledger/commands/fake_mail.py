"""``ledger fake-mail``: run the smtp channel's relay (aiosmtpd) and IMAP archive (dovecot)."""

from __future__ import annotations

import asyncio
import json
import secrets
import shutil
import tempfile
from pathlib import Path
from typing import Annotated, Any

import typer

from events.errors import LedgerError
from ledger.commands.serving import run_server, stop_on_signals

NO_AIOSMTPD = LedgerError(
    "the fake mail server needs aiosmtpd, which is not installed",
    "install the dev extra: .venv/bin/pip install -e '.[dev]'",
)


async def serve(
    port: int, imap_port: int, seed: int, drop_share: float, tempfail_share: float, as_json: bool
) -> None:
    """Start both servers, print where they are, and serve until SIGINT/SIGTERM."""
    try:
        from ledger.simulator.mail import (
            IMAP_USER,
            Dovecot,
            DovecotFailed,
            MailFaultMix,
            MailServer,
            MailStack,
        )
    except ModuleNotFoundError as exc:
        if exc.name == "aiosmtpd" or (exc.name or "").startswith("aiosmtpd."):
            raise NO_AIOSMTPD from None
        raise
    stop = stop_on_signals()
    root = await asyncio.to_thread(_new_root)
    mix = MailFaultMix(seed=seed, drop_share=drop_share, tempfail_share=tempfail_share)
    smtp = await asyncio.to_thread(MailServer, root, port, mix)
    imap: Dovecot | None = None
    try:
        await asyncio.to_thread(smtp.start)
        imap = Dovecot(
            smtp.archive_dir,
            port=imap_port,
            username=IMAP_USER,
            password=secrets.token_urlsafe(16),
        )
        try:
            await asyncio.to_thread(imap.start)
        except DovecotFailed as exc:
            hint = "pick another --imap-port (0: any)" if "in use" in exc.reason else ""
            raise LedgerError(f"dovecot did not start: {exc.reason}", hint) from None
        # The origin key is the workers' secret, not the relay's: made here only so that the
        # printed entry is complete.
        entry = MailStack(smtp, imap, origin_key=secrets.token_urlsafe(32)).config()
        for name in ("from_address", "message_id_domain"):  # the workers' own choice
            entry.pop(name, None)
        _announce(entry, smtp.delivered_dir, smtp.archive_dir, as_json)
        await stop.wait()
    finally:
        if imap is not None:
            await asyncio.to_thread(imap.stop)
        await asyncio.to_thread(smtp.stop)
        shutil.rmtree(root, ignore_errors=True)
    print("fake mail stopped", flush=True)


def _new_root() -> Path:
    root = Path(tempfile.mkdtemp(prefix="ledger-fake-mail-", dir="/tmp"))
    root.chmod(0o755)  # dovecot runs as nobody under root: it must reach the archive
    return root


def _announce(entry: dict[str, Any], maildir: Path, archive: Path, as_json: bool) -> None:
    smtp = f"{entry['host']}:{entry['port']}"
    imap = f"{entry['imap_host']}:{entry['imap_port']}"
    if as_json:
        document = {
            "smtp": smtp,
            "imap": imap,
            "maildir": str(maildir),
            "archive": str(archive),
            "settings": entry,
        }
        print(json.dumps(document), flush=True)
        return
    print("fake mail listening (Ctrl-C stops it)")
    print(f"  smtp:     {smtp}   (no TLS, no AUTH, no dedupe)")
    print(f"  imap:     {imap}   (the archive, mailbox {entry['imap_mailbox']})")
    print(f"  user:     {entry['imap_username']}   password: {entry['imap_password']}")
    print(f"  maildir:  {maildir}   (removed on exit)")
    print(f"  LEDGER_CHANNELS__SETTINGS smtp entry (add from_address): {json.dumps(entry)}")


app = typer.Typer()


@app.command("fake-mail")
def fake_mail(
    port: Annotated[
        int, typer.Option(min=0, max=65535, help="SMTP port (0: any free below 32768).")
    ] = 8825,
    imap_port: Annotated[
        int, typer.Option(min=0, max=65535, help="IMAP port (0: any free below 32768).")
    ] = 8143,
    seed: Annotated[int, typer.Option(help="Seed of the random fault mix.")] = 0,
    drop_pct: Annotated[
        float,
        typer.Option(min=0, max=100, help="% of messages stored, then the connection dropped."),
    ] = 0,
    tempfail_pct: Annotated[
        float, typer.Option(min=0, max=100, help="% of RCPT commands answered 421.")
    ] = 0,
    as_json: Annotated[
        bool, typer.Option("--json", help="Print the addresses and settings as JSON.")
    ] = False,
) -> None:
    """Run an SMTP relay (aiosmtpd) and its IMAP archive (dovecot) on 127.0.0.1.

    Every accepted message goes into a Maildir and a copy into the archive that dovecot
    serves; no dedupe. The printed settings are LEDGER_CHANNELS__SETTINGS[smtp]'s.
    """
    run_server(
        serve(port, imap_port, seed, drop_pct / 100, tempfail_pct / 100, as_json),
        "pick other ports with --port and --imap-port (0: any)",
    )
