"""Webhooks never reach Baton's own network unless allowed: loopback, private, link-local and
other non-public receivers are refused at registration (a literal address) and at connection
(whatever the host name resolves to)."""

from __future__ import annotations

import pytest

from backend.tasks.factories import answered_task
from backend.webhooks.addresses import BlockedAddress, is_public, public_address
from backend.webhooks.models import WebhookDelivery
from backend.webhooks.sender import deliver_due, http_client
from backend.webhooks.services import create_endpoint


@pytest.mark.parametrize(
    ("address", "public"),
    [
        ("93.184.216.34", True),
        ("2606:2800:220:1:248:1893:25c8:1946", True),
        ("127.0.0.1", False),
        ("10.1.2.3", False),
        ("172.16.0.9", False),
        ("192.168.1.1", False),
        ("169.254.169.254", False),  # a cloud's metadata service
        ("100.64.0.1", False),  # carrier-grade NAT
        ("0.0.0.0", False),  # noqa: S104 (an address checked, not bound)
        ("224.0.0.1", False),
        ("::1", False),
        ("fe80::1%eth0", False),
        ("fd00::1", False),
        ("::ffff:127.0.0.1", False),  # loopback written as IPv6
        ("::ffff:93.184.216.34", True),
    ],
)
def test_which_addresses_are_public(address, public):
    assert is_public(address) is public


def test_a_name_is_checked_by_what_it_resolves_to():
    with pytest.raises(BlockedAddress):
        public_address("localhost", 80)
    assert public_address("93.184.216.34", 443) == "93.184.216.34"


@pytest.mark.django_db
@pytest.mark.parametrize(
    "url",
    [
        "http://127.0.0.1:9000/hook",
        "http://[::1]/hook",
        "https://10.0.0.5/hook",
        "http://169.254.169.254/latest/meta-data/",
    ],
)
def test_registering_a_non_public_address_is_a_400_naming_url(api, settings, url):
    settings.BATON_WEBHOOK_ALLOW_PRIVATE_ADDRESSES = False
    response = api.post("/api/webhooks/", {"url": url}, format="json")
    assert response.status_code == 400, response.json()
    assert "url" in response.json()["fields"]
    assert "public address" in response.json()["detail"]


@pytest.mark.django_db
def test_a_public_address_registers_with_the_guard_on(api, settings):
    settings.BATON_WEBHOOK_ALLOW_PRIVATE_ADDRESSES = False
    response = api.post("/api/webhooks/", {"url": "https://93.184.216.34/hook"}, format="json")
    assert response.status_code == 201, response.json()


@pytest.mark.django_db
@pytest.mark.parametrize("host", ["127.0.0.1", "localhost"])
def test_the_sender_does_not_connect_to_a_private_receiver(user, receiver, settings, host):
    # Registered while allowed (or by a name that resolves there later): the sender refuses.
    endpoint = create_endpoint(owner=user, url=receiver.url.replace("127.0.0.1", host))
    answered_task(owner=user)
    settings.BATON_WEBHOOK_ALLOW_PRIVATE_ADDRESSES = False
    with http_client() as client:
        assert deliver_due(client=client).retrying == 1
    assert receiver.requests == []
    [delivery] = WebhookDelivery.objects.filter(endpoint=endpoint)
    assert (delivery.last_error, delivery.last_status_code) == ("BlockedAddress", None)
    # Allowed again (a development machine), the same delivery reaches it.
    settings.BATON_WEBHOOK_ALLOW_PRIVATE_ADDRESSES = True
    delivery.next_attempt_at = delivery.created_at
    delivery.save(update_fields=["next_attempt_at"])
    with http_client() as client:
        assert deliver_due(client=client).delivered == 1
    assert len(receiver.requests) == 1
