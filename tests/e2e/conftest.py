"""Fixtures of the end-to-end tests: a product account and a worker account on the live server,
and headless Chromium for the admin's (`tests/e2e/browser.py`)."""

from __future__ import annotations

from collections.abc import Iterator

import httpx
import pytest
from django.contrib.auth import get_user_model
from rest_framework.authtoken.models import Token

from backend.dispatch.workers import ensure_worker_account
from tests.e2e.browser import browser, shipped_policies  # noqa: F401 (the browser tests' fixtures)
from tests.e2e.live import Baton


@pytest.fixture
def baton(live_server, settings) -> Iterator[Baton]:
    settings.BATON_RETRY_BACKOFF_SECONDS = 0  # retried turns are claimable again at once
    owner = get_user_model().objects.create_user(username="product")
    token = Token.objects.create(user=owner).key
    _, worker_token = ensure_worker_account(username="e2e-worker")
    with httpx.Client(
        base_url=live_server.url, headers={"Authorization": f"Token {token}"}, timeout=30
    ) as product:
        yield Baton(url=live_server.url, product=product, worker_token=worker_token)
