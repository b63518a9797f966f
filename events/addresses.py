"""Which network addresses a delivery may make us contact.

A recipient comes from an agent, often from a model's output: without a guard, a
delivery to ``http://169.254.169.254/`` or ``http://10.0.0.5/admin`` makes the worker a
proxy into the network it runs in. Every address a name resolves to is checked before a
connection is made; only globally routable unicast addresses pass, unless an operator
allowed a network (CIDR) or a host name explicitly. The demo and the tests allow
127.0.0.0/8, where their receivers listen.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Iterable

IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address
IPNetwork = ipaddress.IPv4Network | ipaddress.IPv6Network

# Named for the reason in the event; checked in this order (the first that holds).
_KINDS: tuple[tuple[str, str], ...] = (
    ("is_unspecified", "unspecified"),
    ("is_loopback", "loopback"),
    ("is_link_local", "link-local"),
    ("is_multicast", "multicast"),
    ("is_reserved", "reserved"),
    ("is_private", "private"),
)


def parse_network(text: str) -> IPNetwork:
    """``text`` as a network (an address is a /32 or /128); ValueError says what is wrong."""
    try:
        return ipaddress.ip_network(text.strip(), strict=False)
    except ValueError:
        raise ValueError(f"{text!r} is not an IP network (CIDR) or address") from None


class AddressPolicy:
    """Allowed: globally routable unicast addresses, plus the networks and host names
    given. Everything else is refused with a reason."""

    def __init__(self, networks: Iterable[str] = (), hosts: Iterable[str] = ()) -> None:
        self.networks = tuple(parse_network(n) for n in networks)
        self.hosts = frozenset(h.strip().lower().rstrip(".") for h in hosts)

    def refuses(self, host: str, address: str) -> str | None:
        """Why ``address`` (which ``host`` resolved to) may not be contacted, or None."""
        if host.lower().rstrip(".") in self.hosts:
            return None
        ip: IPAddress = ipaddress.ip_address(address.split("%", 1)[0])
        if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
            ip = ip.ipv4_mapped  # ::ffff:127.0.0.1 is 127.0.0.1
        if any(ip in network for network in self.networks):
            return None
        for attribute, kind in _KINDS:
            if getattr(ip, attribute):
                return f"{host} resolves to {ip}, a {kind} address"
        if not ip.is_global:
            return f"{host} resolves to {ip}, which is not globally routable"
        return None
