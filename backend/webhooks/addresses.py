"""Where webhooks may go: public addresses only, unless BATON_WEBHOOK_ALLOW_PRIVATE_ADDRESSES.

A webhook URL is the product's to choose, and the sender runs inside Baton's network. Without a
guard, a URL naming 127.0.0.1, 10.0.0.5 or 169.254.169.254 (a cloud's metadata service) — or a
host name that resolves to one — would make Baton POST into its own network (server-side
request forgery). The guard sits where the connection is made: the sender's transport resolves
the host itself, refuses the connection when any of its addresses is not a global unicast
address, and connects to an address it checked, so a name that resolves elsewhere a moment
later (DNS rebinding) changes nothing. TLS still verifies the certificate for the URL's host
name. Registration refuses a URL whose host is a literal non-public address, with a 400.

An IPv6 address that embeds an IPv4 address (NAT64, 6to4, Teredo, IPv4-compatible or -mapped)
reaches that address through a translator or a tunnel, so it is judged by it as well
(`embedded_ipv4`); NAT64's local-use prefix and the deprecated site-local prefix are never
public.

The setting is on by default in development (receivers on the same machine are the usual test)
and off in production.
"""

from __future__ import annotations

import ipaddress
import socket
from collections.abc import Iterable
from typing import Any

import httpcore
import httpx
from django.conf import settings


class BlockedAddress(Exception):  # noqa: N818 (what the attempt records as its error)
    """The receiver's host is, or resolves to, an address webhooks may not reach."""


# IPv6 prefixes whose addresses carry an IPv4 address in their last 32 bits (IPv4-mapped,
# 6to4 and Teredo have `ipaddress` properties): NAT64's well-known prefix (RFC 6052; a
# translator forwards the packet to that IPv4 address) and IPv4-compatible addresses (RFC 4291,
# deprecated: the IPv4 address itself, written as IPv6).
_NAT64_WELL_KNOWN = ipaddress.IPv6Network("64:ff9b::/96")
_IPV4_COMPATIBLE = ipaddress.IPv6Network("::/96")
# Neither global nor judged by an embedded address: NAT64's local-use prefix (RFC 8215: a
# site's own translators, where the IPv4 address may sit at any of RFC 6052's positions) and
# the deprecated site-local prefix (RFC 3879), which `ipaddress` calls global.
_NEVER_PUBLIC_IPV6 = (
    ipaddress.IPv6Network("64:ff9b:1::/48"),
    ipaddress.IPv6Network("fec0::/10"),
)


def embedded_ipv4(ip: ipaddress.IPv6Address) -> list[ipaddress.IPv4Address]:
    """The IPv4 addresses an IPv6 address stands for: IPv4-mapped (::ffff:0:0/96), NAT64
    (64:ff9b::/96), IPv4-compatible (::/96), 6to4 (2002::/16, bits 16–47) and Teredo
    (2001::/32: the server in bits 32–63, the client in the last 32 bits, inverted)."""
    if ip.ipv4_mapped is not None:
        return [ip.ipv4_mapped]
    if ip.sixtofour is not None:
        return [ip.sixtofour]
    if ip.teredo is not None:
        return list(ip.teredo)
    if ip in _NAT64_WELL_KNOWN or ip in _IPV4_COMPATIBLE:
        return [ipaddress.IPv4Address(int(ip) & 0xFFFFFFFF)]
    return []


def is_public(address: str) -> bool:
    """Whether `address` (an IP address) is one webhooks may reach: global unicast, and an
    IPv6 address that embeds IPv4 addresses only when each of them is (a packet to it reaches
    that IPv4 address through a translator or a tunnel). An IPv4-mapped or IPv4-compatible
    address is judged by its IPv4 address alone: it is that address, written as IPv6."""
    ip = ipaddress.ip_address(address.split("%", 1)[0])
    if isinstance(ip, ipaddress.IPv4Address):
        return _is_global_unicast(ip)
    if any(ip in network for network in _NEVER_PUBLIC_IPV6):
        return False
    written_as_ipv6 = ip.ipv4_mapped is not None or ip in _IPV4_COMPATIBLE
    if not written_as_ipv6 and not _is_global_unicast(ip):
        return False
    return all(_is_global_unicast(ipv4) for ipv4 in embedded_ipv4(ip))


def _is_global_unicast(ip: ipaddress.IPv4Address | ipaddress.IPv6Address) -> bool:
    return ip.is_global and not ip.is_multicast


def literal_address(host: str) -> str | None:
    """`host` as an IP address when it is one (brackets of an IPv6 literal removed)."""
    try:
        return str(ipaddress.ip_address(host.strip("[]")))
    except ValueError:
        return None


def private_addresses_allowed() -> bool:
    return settings.BATON_WEBHOOK_ALLOW_PRIVATE_ADDRESSES


def public_address(host: str, port: int) -> str:
    """An address of `host` to connect to; raises BlockedAddress when any of them is not
    public (a name with one private address among public ones is refused too: which one a
    client would use is not ours to guess)."""
    addresses: Iterable[str]
    literal = literal_address(host)
    if literal is not None:
        addresses = [literal]
    else:
        try:
            infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
        except OSError as error:
            raise httpcore.ConnectError(f"cannot resolve the receiver's host: {error}") from error
        addresses = [str(info[4][0]) for info in infos]
    if not addresses or not all(is_public(address) for address in addresses):
        raise BlockedAddress("the receiver's host is not a public address")
    return next(iter(addresses))


class _PublicOnlyBackend(httpcore.SyncBackend):
    def connect_tcp(
        self,
        host: str,
        port: int,
        timeout: float | None = None,
        local_address: str | None = None,
        socket_options: Iterable[Any] | None = None,
    ) -> httpcore.NetworkStream:
        return super().connect_tcp(
            public_address(host, port), port, timeout, local_address, socket_options
        )


class PublicOnlyTransport(httpx.HTTPTransport):
    """httpx's transport, its connections made through `_PublicOnlyBackend`. httpx takes no
    network backend, so its connection pool's is replaced (a test sending to 127.0.0.1 with
    the guard on fails if a release of httpx moves it)."""

    def __init__(self) -> None:
        super().__init__(trust_env=False)
        self._pool._network_backend = _PublicOnlyBackend()
