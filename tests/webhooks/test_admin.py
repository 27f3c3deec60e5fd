"""The admin shows endpoints and deliveries, searchable by task, never a whole secret."""

from __future__ import annotations

import pytest

from backend.tasks.factories import answered_task
from backend.webhooks.services import create_endpoint

pytestmark = pytest.mark.django_db


@pytest.fixture
def admin_user_client(client, django_user_model):
    admin = django_user_model.objects.create_superuser("root", "root@example.com", "pw")
    client.force_login(admin)
    return client


def test_endpoints_and_deliveries_are_visible_and_secrets_are_not(admin_user_client, user):
    endpoint = create_endpoint(owner=user, url="https://product.example/hooks")
    task = answered_task(owner=user)
    other = answered_task(owner=user)
    listing = admin_user_client.get("/admin/webhooks/webhookendpoint/")
    assert listing.status_code == 200
    page = admin_user_client.get(f"/admin/webhooks/webhookendpoint/{endpoint.pk}/change/")
    assert page.status_code == 200
    assert endpoint.secret not in page.content.decode()
    assert endpoint.secret[:10] in page.content.decode()
    found = admin_user_client.get("/admin/webhooks/webhookdelivery/", {"q": str(task.pk)})
    assert found.status_code == 200
    assert found.context["cl"].result_count == 1
    assert found.context["cl"].result_list[0].task_id == task.pk
    assert other.pk != task.pk
    assert admin_user_client.get("/admin/webhooks/webhookdelivery/", {"q": "x"}).status_code == 200
