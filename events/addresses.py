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
import socket
from collections.abc import Iterable, Mapping
from urllib.parse import urlsplit

IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address
IPNetwork = ipaddress.IPv4Network | ipaddress.IPv6Network
# Where a connection goes: the host name (lowercased, no brackets) and the port.
Origin = tuple[str, int]
_DEFAULT_PORTS = {"http": 80, "https": 443}

_NAT64 = ipaddress.IPv6Network("64:ff9b::/96")  # RFC 6052, the well-known prefix
_LOCAL_NAT64 = ipaddress.IPv6Network("64:ff9b:1::/48")  # RFC 8215
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

    def __init__(
        self,
        networks: Iterable[str] = (),
        hosts: Iterable[str] = (),
        per_origin: Mapping[Origin, Iterable[str]] | None = None,
    ) -> None:
        """``per_origin``: networks allowed only for connections to that host and port
        (an endpoint's own allow-list), on top of ``networks``."""
        self.networks = tuple(parse_network(n) for n in networks)
        self.hosts = frozenset(_name(h) for h in hosts)
        self.per_origin = {
            (_name(host), port): tuple(parse_network(n) for n in allowed)
            for (host, port), allowed in (per_origin or {}).items()
        }

    def refuses_literal(self, host: str, port: int | None = None) -> str | None:
        """Why ``host`` is refused without resolving it (an address literal in any
        spelling, ``localhost``), or None: None does not mean allowed — a name is decided
        when the worker resolves it."""
        address = literal_address(host)
        why = None if address is None else self.refuses(host, address, port)
        if why is None:
            return None
        # "0x7f000001 is 127.0.0.1, a loopback address"; "10.0.0.5 is a private address"
        why = why.replace(f"{host} resolves to ", f"{host} is ", 1)
        if host.strip("[]") == address:
            why = why.replace(f"{host} is {address}, which carries ", f"{host} carries ", 1)
            why = why.replace(f"{host} is {address}, ", f"{host} is ", 1)
        return why

    def refuses(self, host: str, address: str, port: int | None = None) -> str | None:
        """Why ``address`` (which ``host`` resolved to) may not be contacted on ``port``,
        or None."""
        if _name(host) in self.hosts:
            return None
        written: IPAddress = ipaddress.ip_address(address.split("%", 1)[0])
        extra = self.per_origin.get((_name(host), port), ()) if port is not None else ()
        if any(written in network for network in (*self.networks, *extra)):
            return None
        ip = embedded_ipv4(written)
        if isinstance(ip, str):
            return f"{host} resolves to {written}, {ip}"
        if ip is not written and any(ip in network for network in (*self.networks, *extra)):
            return None
        shown = str(ip) if ip == written else f"{written}, which carries {ip},"
        for attribute, kind in _KINDS:
            if getattr(ip, attribute):
                article = "an" if kind[0] in "aeiou" else "a"
                return f"{host} resolves to {shown} {article} {kind} address".replace(
                    f"{ip} {article}", f"{ip}, {article}", 1
                )
        if not ip.is_global:
            return f"{host} resolves to {shown.rstrip(',')}, which is not globally routable"
        return None


def is_loopback(host: str) -> bool:
    """True for 127.0.0.0/8, ::1 and ``localhost``: a binding nothing outside this machine
    reaches; anything else (a wildcard, an interface, a name) is reachable from outside."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def embedded_ipv4(ip: IPAddress) -> IPAddress | str:
    """The address a connection to ``ip`` really reaches: the IPv4 address an IPv6
    translation or tunnel prefix carries (``::ffff:a.b.c.d``, 6to4 ``2002::/16``, NAT64
    ``64:ff9b::/96``), ``ip`` itself otherwise; or why it is refused outright (Teredo,
    whose client address is obfuscated; local-use NAT64, whose embedding is the
    operator's; deprecated site-local ``fec0::/10``, routed like a private network)."""
    if isinstance(ip, ipaddress.IPv4Address):
        return ip
    if ip.ipv4_mapped is not None:
        return ip.ipv4_mapped  # ::ffff:127.0.0.1 is 127.0.0.1
    if ip.sixtofour is not None:
        return ip.sixtofour  # 2002:7f00:1::1 tunnels to 127.0.0.1
    if ip in _NAT64:
        return ipaddress.IPv4Address(int(ip) & 0xFFFFFFFF)  # 64:ff9b::7f00:1 is 127.0.0.1
    if ip.teredo is not None:
        return "a Teredo tunnel address (2001::/32), whose destination cannot be checked"
    if ip in _LOCAL_NAT64:
        return "a local-use NAT64 address (64:ff9b:1::/48), whose destination cannot be checked"
    if ip.is_site_local:
        return "a site-local address (fec0::/10)"
    return ip


def literal_address(host: str) -> str | None:
    """The address ``host`` denotes without DNS, or None for a name to resolve.

    Every spelling a resolver takes as a number counts: ``127.0.0.1``, ``[::1]``, and the
    inet_aton forms ``0x7f000001``, ``2130706433``, ``0177.0.0.1``, ``127.1``. So do
    ``localhost`` and ``*.localhost``, which resolve to loopback by definition (RFC 6761).
    """
    name = host.strip().strip("[]").lower().rstrip(".")
    try:
        return str(ipaddress.ip_address(name.split("%", 1)[0]))
    except ValueError:
        pass
    if name == "localhost" or name.endswith(".localhost"):
        return "127.0.0.1"
    if name and all(part.isalnum() for part in name.split(".")) and name[0].isdigit():
        try:
            return socket.inet_ntoa(socket.inet_aton(name))
        except OSError:
            return None
    return None


def _name(host: str) -> str:
    return host.strip().strip("[]").lower().rstrip(".")


def origin_of(url: str) -> Origin | None:
    """The (host, port) a request to ``url`` connects to (default ports filled in), or
    None if it has no http(s) host."""
    try:
        parts = urlsplit(url)
        port = parts.port
    except ValueError:
        return None
    if parts.scheme not in _DEFAULT_PORTS or not parts.hostname:
        return None
    return _name(parts.hostname), port or _DEFAULT_PORTS[parts.scheme]
