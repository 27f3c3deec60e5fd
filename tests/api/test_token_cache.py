"""A server process remembers a token's account for BATON_TOKEN_CACHE_SECONDS, and forgets it
the moment the token, the account or its worker group membership changes."""

from __future__ import annotations

import pytest
from django.contrib.auth.models import Group
from rest_framework.authtoken.models import Token

from backend.api import authentication
from backend.dispatch.workers import EXECUTOR_GROUP
from tests.conftest import token_client

pytestmark = pytest.mark.django_db

DISPATCH = {"worker_id": "w", "kinds": ["codex"], "limit": 1}


@pytest.fixture(autouse=True)
def forgotten():
    authentication.forget_tokens()
    yield
    authentication.forget_tokens()


def test_a_remembered_token_costs_no_query(api, django_assert_num_queries):
    # No tasks: the page is its count alone.
    with django_assert_num_queries(3):  # token with its account, worker check, page count
        assert api.get("/api/tasks/").status_code == 200
    with django_assert_num_queries(1):
        assert api.get("/api/tasks/").status_code == 200


def test_without_a_cache_every_request_looks_the_token_up(api, settings, django_assert_num_queries):
    settings.BATON_TOKEN_CACHE_SECONDS = 0
    api.get("/api/tasks/")
    with django_assert_num_queries(3):
        assert api.get("/api/tasks/").status_code == 200


def test_a_remembered_token_runs_out(api, monkeypatch, django_assert_num_queries):
    api.get("/api/tasks/")
    later = authentication.time.monotonic() + 11
    monkeypatch.setattr(authentication.time, "monotonic", lambda: later)
    with django_assert_num_queries(3):
        assert api.get("/api/tasks/").status_code == 200


def test_a_deleted_token_is_refused_at_once(api, user):
    assert api.get("/api/tasks/").status_code == 200
    Token.objects.filter(user=user).delete()
    response = api.get("/api/tasks/")
    assert response.status_code == 401
    assert "token" in response.json()["detail"].lower()


def test_a_deactivated_account_is_refused_at_once(api, user):
    assert api.get("/api/tasks/").status_code == 200
    user.is_active = False
    user.save()
    assert api.get("/api/tasks/").status_code == 401


def test_a_worker_taken_out_of_the_worker_group_loses_the_executor_api_at_once(worker):
    client = token_client(worker)
    assert client.post("/api/executor/dispatch/", DISPATCH, format="json").status_code == 200
    worker.groups.remove(Group.objects.get(name=EXECUTOR_GROUP))
    response = client.post("/api/executor/dispatch/", DISPATCH, format="json")
    assert response.status_code == 403
    # ...and, as a product client now, may use the task API.
    assert client.get("/api/tasks/").status_code == 200


def test_an_unknown_token_is_not_remembered(user):
    client = token_client(user)
    key = Token.objects.get(user=user).key
    Token.objects.filter(user=user).delete()
    assert client.get("/api/tasks/").status_code == 401
    Token.objects.create(user=user, key=key)  # the same key, issued again
    assert client.get("/api/tasks/").status_code == 200


def test_one_request_cannot_change_the_account_another_request_gets(api):
    api.get("/api/tasks/")
    first = authentication.CachedTokenAuthentication().authenticate_credentials(
        api._credentials["HTTP_AUTHORIZATION"].split()[1]
    )[0]
    first.username = "changed in one request"
    second = authentication.CachedTokenAuthentication().authenticate_credentials(
        api._credentials["HTTP_AUTHORIZATION"].split()[1]
    )[0]
    assert second.username == "alice"
