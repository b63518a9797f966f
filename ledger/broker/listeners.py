"""Where the local broker's listeners are bound, and the rule that keeps the
unauthenticated ones off the network.

The PLAINTEXT and CONTROLLER listeners authenticate nobody: their principal is
``User:ANONYMOUS``, a super user (ledger/broker/security.py), so whoever reaches them
bypasses SASL and every ACL. They are bound to loopback whenever the authenticated
SASL_SSL listener is on; without it, the broker as a whole may only listen on loopback.
"""

from __future__ import annotations

import socket
from dataclasses import dataclass

from config.settings import Settings
from events.addresses import is_loopback
from ledger.errors import UsageError

LOOPBACK = "127.0.0.1"
WILDCARDS = frozenset({"0.0.0.0", "::", "[::]"})  # noqa: S104 - names, not a binding


@dataclass(frozen=True)
class Listeners:
    """The host each listener binds to (and advertises: a wildcard SASL_SSL binding
    advertises this machine's name, which its certificate then names too)."""

    plaintext_host: str
    controller_host: str
    sasl_ssl_host: str | None
    sasl_ssl_advertised: str | None = None

    def ports(self, settings: Settings) -> list[tuple[str, int]]:
        """(host, port) of every listener, in the order they are configured."""
        bound = [
            (self.plaintext_host, settings.kafka.broker_port),
            (self.controller_host, settings.kafka.controller_port),
        ]
        if self.sasl_ssl_host is not None and settings.kafka.broker_sasl_ssl_port:
            bound.append((self.sasl_ssl_host, settings.kafka.broker_sasl_ssl_port))
        return bound


def check_exposure(settings: Settings) -> None:
    """``UsageError`` (exit 2) for a non-loopback broker host without SASL_SSL."""
    host = settings.kafka.broker_host
    if not settings.kafka.broker_sasl_ssl_port and not is_loopback(host):
        raise UsageError(
            f"refusing to bind the local broker to {host} (not loopback) without "
            "authentication: its PLAINTEXT listener lets anyone in as a super user",
            "set LEDGER_KAFKA__BROKER_HOST=127.0.0.1, or turn on SASL_SSL with "
            "--sasl-ssl-port (LEDGER_KAFKA__BROKER_SASL_SSL_PORT); the unauthenticated "
            "listeners then stay on loopback",
        )


def listeners_for(settings: Settings) -> Listeners:
    """The listeners' hosts (``check_exposure`` decides whether they may be used)."""
    host = settings.kafka.broker_host
    if not settings.kafka.broker_sasl_ssl_port:
        return Listeners(host, host, None)
    # An authenticated broker may face the network; its unauthenticated doors may not.
    inside = host if is_loopback(host) else LOOPBACK
    # Kafka refuses to advertise a wildcard: clients are told this machine's name.
    advertised = socket.gethostname() if host in WILDCARDS else host
    return Listeners(inside, inside, host, advertised)
