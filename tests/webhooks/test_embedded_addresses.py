"""IPv6 addresses that embed an IPv4 address are judged by it, at registration and at delivery:
NAT64 (64:ff9b::/96), 6to4 (2002::/16), Teredo (2001::/32), IPv4-compatible (::/96) and
IPv4-mapped (::ffff:0:0/96) forms of 127.0.0.1 or 169.254.169.254 reach Baton's own network
through a translator or a tunnel; NAT64's local-use prefix and site-local addresses are never
public."""

from __future__ import annotations

import ipaddress
import socket

import pytest

from backend.tasks.factories import answered_task
from backend.webhooks.addresses import embedded_ipv4, is_public
from backend.webhooks.models import WebhookDelivery
from backend.webhooks.sender import deliver_due, http_client
from backend.webhooks.services import create_endpoint

# (address, public, why)
EMBEDDING = [
    ("64:ff9b::7f00:1", False, "NAT64 of 127.0.0.1"),
    ("64:ff9b::a9fe:a9fe", False, "NAT64 of 169.254.169.254, a cloud's metadata service"),
    ("64:ff9b::a00:5", False, "NAT64 of 10.0.0.5"),
    ("64:ff9b::5db8:d822", True, "NAT64 of 93.184.216.34"),
    ("64:ff9b:1::7f00:1", False, "NAT64 local-use prefix"),
    ("64:ff9b:1::5db8:d822", False, "NAT64 local-use prefix, even of a public address"),
    ("2002:7f00:1::", False, "6to4 of 127.0.0.1"),
    ("2002:a9fe:a9fe::1", False, "6to4 of 169.254.169.254"),
    ("2002:5db8:d822::1", True, "6to4 of 93.184.216.34"),
    ("2001:0:5db8:d822:0:0:80ff:fffe", False, "Teredo: client 127.0.0.1 (inverted)"),
    ("2001:0:7f00:1::5db8:d822", False, "Teredo: server 127.0.0.1"),
    ("::127.0.0.1", False, "IPv4-compatible 127.0.0.1"),
    ("::a9fe:a9fe", False, "IPv4-compatible 169.254.169.254"),
    ("::93.184.216.34", True, "IPv4-compatible 93.184.216.34"),
    ("::ffff:169.254.169.254", False, "IPv4-mapped 169.254.169.254"),
    ("::ffff:93.184.216.34", True, "IPv4-mapped 93.184.216.34"),
    ("fec0::1", False, "site-local (deprecated)"),
    ("fefe::1", False, "site-local (deprecated), the top of fec0::/10"),
    ("2606:2800:220:1:248:1893:25c8:1946", True, "global unicast"),
]
REFUSED_LITERALS = [address for address, public, _ in EMBEDDING if not public]


@pytest.mark.parametrize(("address", "public", "why"), EMBEDDING)
def test_an_address_embedding_ipv4_is_judged_by_it(address, public, why):
    assert is_public(address) is public, why


@pytest.mark.parametrize(
    ("address", "embedded"),
    [
        ("64:ff9b::7f00:1", ["127.0.0.1"]),
        ("2002:7f00:1::", ["127.0.0.1"]),
        ("2001:0:5db8:d822:0:0:80ff:fffe", ["93.184.216.34", "127.0.0.1"]),
        ("::127.0.0.1", ["127.0.0.1"]),
        ("::ffff:10.0.0.5", ["10.0.0.5"]),
        ("2606:2800:220:1:248:1893:25c8:1946", []),
    ],
)
def test_the_embedded_ipv4_addresses(address, embedded):
    assert [str(ip) for ip in embedded_ipv4(ipaddress.IPv6Address(address))] == embedded


@pytest.mark.django_db
@pytest.mark.parametrize("address", REFUSED_LITERALS)
def test_registering_an_embedded_private_address_is_a_400_naming_url(api, settings, address):
    settings.BATON_WEBHOOK_ALLOW_PRIVATE_ADDRESSES = False
    response = api.post("/api/webhooks/", {"url": f"http://[{address}]/hook"}, format="json")
    assert response.status_code == 400, response.json()
    assert "url" in response.json()["fields"]
    assert "public address" in response.json()["detail"]


@pytest.mark.django_db
@pytest.mark.parametrize("address", ["64:ff9b::5db8:d822", "2002:5db8:d822::1"])
def test_registering_an_embedded_public_address_is_a_201(api, settings, address):
    settings.BATON_WEBHOOK_ALLOW_PRIVATE_ADDRESSES = False
    response = api.post("/api/webhooks/", {"url": f"https://[{address}]/hook"}, format="json")
    assert response.status_code == 201, response.json()


def _resolving(monkeypatch, names: dict[str, str]) -> None:
    """Names that resolve to the given IPv6 addresses (no DNS server here can serve them)."""
    real = socket.getaddrinfo

    def getaddrinfo(host, port, *args, **kwargs):
        if host in names:
            return [(socket.AF_INET6, socket.SOCK_STREAM, 6, "", (names[host], port, 0, 0))]
        return real(host, port, *args, **kwargs)

    monkeypatch.setattr(socket, "getaddrinfo", getaddrinfo)


@pytest.mark.django_db
@pytest.mark.parametrize("address", ["64:ff9b::7f00:1", "2002:7f00:1::", "::127.0.0.1", "fec0::1"])
@pytest.mark.parametrize("by_name", [False, True])
def test_the_sender_refuses_an_embedded_private_address(
    user, settings, monkeypatch, address, by_name
):
    # Registered while allowed (or a name that resolves there later): the sender refuses
    # before it connects, and records why.
    host = f"[{address}]"
    if by_name:
        host = "receiver.example.test"
        _resolving(monkeypatch, {host: address})
    endpoint = create_endpoint(owner=user, url=f"http://{host}:9/hook")
    answered_task(owner=user)
    settings.BATON_WEBHOOK_ALLOW_PRIVATE_ADDRESSES = False
    with http_client() as client:
        assert deliver_due(client=client).retrying == 1
    [delivery] = WebhookDelivery.objects.filter(endpoint=endpoint)
    assert (delivery.last_error, delivery.last_status_code) == ("BlockedAddress", None)
