"""Where webhooks may go: public addresses only, unless BATON_WEBHOOK_ALLOW_PRIVATE_ADDRESSES.

A webhook URL is the product's to choose, and the sender runs inside Baton's network. Without a
guard, a URL naming 127.0.0.1, 10.0.0.5 or 169.254.169.254 (a cloud's metadata service) — or a
host name that resolves to one — would make Baton POST into its own network (server-side
request forgery). The guard sits where the connection is made: the sender's transport resolves
the host itself, refuses the connection when any of its addresses is not a global unicast
address, and connects to an address it checked, so a name that resolves elsewhere a moment
later (DNS rebinding) changes nothing. TLS still verifies the certificate for the URL's host
name. Registration refuses a URL whose host is a literal non-public address, with a 400.

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


def is_public(address: str) -> bool:
    """Whether `address` (an IP address) is one webhooks may reach: global unicast."""
    ip = ipaddress.ip_address(address.split("%", 1)[0])
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        ip = ip.ipv4_mapped
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
