"""The history policy API: staff read and change caps; invalid combinations name the field."""

from __future__ import annotations

import pytest

from backend.dispatch.models import HistoryPolicy
from backend.dispatch.policies import row_values

pytestmark = pytest.mark.django_db


def test_staff_list_the_shipped_policies(staff_api):
    body = staff_api.get("/api/policies/").json()
    assert [(row["name"], row["max_messages"], row["max_chars"]) for row in body] == [
        ("default", 20, 40_000),
        ("chat", 12, 20_000),
        ("code", 20, 40_000),
    ]


def test_change_bumps_the_version(staff_api, staff_user):
    response = staff_api.patch("/api/policies/chat/", {"max_messages": 5}, format="json")
    assert response.status_code == 200, response.json()
    assert (response.json()["max_messages"], response.json()["version"]) == (5, 2)
    assert response.json()["updated_by"] == staff_user.username
    assert HistoryPolicy.objects.get(task_type="chat").max_messages == 5


def test_new_task_type_gets_a_row(staff_api):
    response = staff_api.patch(
        "/api/policies/research/", {"max_messages": 4, "max_chars": 9_000}, format="json"
    )
    assert response.status_code == 201
    assert staff_api.get("/api/policies/research/").json()["max_chars"] == 9_000


def test_default_row_by_name(staff_api):
    response = staff_api.patch("/api/policies/default/", {"enabled": False}, format="json")
    assert response.status_code == 200
    assert HistoryPolicy.objects.get(task_type="").enabled is False


@pytest.mark.parametrize(
    ("body", "field", "fragment"),
    [
        (
            {"per_message_max_chars": 90_000},
            "per_message_max_chars",
            "per_message_max_chars must not exceed",
        ),
        ({"max_tokens": 100}, "max_tokens", "at least 1024"),
        ({"max_tokens_fraction": 0}, "max_tokens_fraction", "at most 1"),
        ({"max_tokens_fraction": 1.5}, "max_tokens_fraction", "at most 1"),
        ({"token_encoding": "nope"}, "token_encoding", "not a token encoding Baton bundles"),
        ({"max_messages": -1}, "max_messages", "positive"),
        ({"context_passing": "everything"}, "context_passing", "not a valid choice"),
        ({"max_mesages": 3}, "max_mesages", "Unknown field"),
    ],
)
def test_invalid_values_are_refused_with_the_reason(staff_api, body, field, fragment):
    response = staff_api.patch("/api/policies/code/", body, format="json")
    assert response.status_code == 400
    error = response.json()
    assert fragment in error["detail"] or fragment in " ".join(error["fields"].get(field, []))
    row = HistoryPolicy.objects.get(task_type="code")
    assert (row.version, row.max_messages) == (1, 20)


INTEGER_CAPS = [
    "max_messages",
    "max_chars",
    "per_message_max_chars",
    "max_tokens",
    "previous_result_max_chars",
    "current_message_max_chars",
]


@pytest.mark.parametrize("name", ["code", "default"])
@pytest.mark.parametrize("field", INTEGER_CAPS)
@pytest.mark.parametrize("value", [2**31, 2**63, -1])
def test_a_cap_outside_its_column_is_400_naming_the_field(staff_api, name, field, value):
    """The caps are 32-bit integer columns: a larger value is refused, not a server error."""
    row = HistoryPolicy.objects.get(task_type="" if name == "default" else name)
    before = (row.version, row_values(row), list(row.overrides))
    response = staff_api.patch(f"/api/policies/{name}/", {field: value}, format="json")
    assert response.status_code == 400, response.content
    error = response.json()
    assert error["fields"] == {
        field: ["Must be a positive integer of at most 2147483647, or null (no cap)."]
    }
    assert field in error["detail"]
    row.refresh_from_db()
    assert (row.version, row_values(row), list(row.overrides)) == before


def test_a_cap_at_the_top_of_its_column_is_stored(staff_api):
    response = staff_api.patch(
        "/api/policies/code/", {"max_chars": 2**31 - 1, "max_tokens": 2**31 - 1}, format="json"
    )
    assert response.status_code == 200, response.json()
    row = HistoryPolicy.objects.get(task_type="code")
    assert (row.max_chars, row.max_tokens) == (2**31 - 1, 2**31 - 1)


def test_only_staff(api, worker_api):
    assert api.get("/api/policies/").status_code == 403
    assert (
        worker_api.patch("/api/policies/code/", {"max_messages": 1}, format="json").status_code
        == 403
    )


def test_bad_task_type_in_the_url(staff_api):
    response = staff_api.patch("/api/policies/Not%20A%20Type/", {"enabled": False}, format="json")
    assert response.status_code == 400
    assert "task_type" in response.json()["fields"]


def test_each_value_says_where_it_comes_from(staff_api, settings):
    """The shipped rows set only what differs from Baton's defaults; the rest is inherited."""
    settings.EXECUTOR_HISTORY_DEFAULTS = {**settings.EXECUTOR_HISTORY_DEFAULTS, "max_messages": 2}
    settings.EXECUTOR_HISTORY_FROM_ENVIRONMENT = frozenset({"max_messages"})
    body = {row["name"]: row for row in staff_api.get("/api/policies/").json()}
    assert body["chat"]["overrides"] == ["max_messages", "max_chars"]
    assert (body["chat"]["max_messages"], body["chat"]["sources"]["max_messages"]) == (
        12,
        "task_type",
    )
    assert (body["code"]["max_messages"], body["code"]["sources"]["max_messages"]) == (
        2,
        "environment",
    )
    assert body["code"]["sources"]["max_chars"] == "built-in"

    staff_api.patch("/api/policies/default/", {"max_chars": 30_000}, format="json")
    code = staff_api.get("/api/policies/code/").json()
    assert (code["max_chars"], code["sources"]["max_chars"]) == (30_000, "default")


def test_a_field_can_be_inherited_again(staff_api):
    response = staff_api.patch("/api/policies/chat/", {"inherit": ["max_chars"]}, format="json")
    assert response.status_code == 200, response.json()
    chat = response.json()
    assert chat["overrides"] == ["max_messages"]
    assert (chat["max_chars"], chat["sources"]["max_chars"]) == (40_000, "built-in")
    refused = staff_api.patch(
        "/api/policies/chat/", {"max_chars": 9_000, "inherit": ["max_chars"]}, format="json"
    )
    assert refused.status_code == 400
    assert refused.json()["fields"] == {"inherit": ["max_chars cannot be both set and inherited."]}
    unknown = staff_api.patch("/api/policies/chat/", {"inherit": ["max_mesages"]}, format="json")
    assert unknown.status_code == 400
    assert unknown.json()["fields"] == {"inherit.0": ['"max_mesages" is not a valid choice.']}


def test_the_budget_fraction_is_set_inherited_and_turned_off(staff_api, settings):
    code = staff_api.get("/api/policies/code/").json()
    assert (code["max_tokens_fraction"], code["sources"]["max_tokens_fraction"]) == (
        0.5,
        "built-in",
    )
    response = staff_api.patch("/api/policies/code/", {"max_tokens_fraction": 0.25}, format="json")
    assert response.status_code == 200, response.json()
    assert response.json()["max_tokens_fraction"] == 0.25
    assert response.json()["sources"]["max_tokens_fraction"] == "task_type"
    response = staff_api.patch("/api/policies/code/", {"max_tokens_fraction": None}, format="json")
    assert response.json()["max_tokens_fraction"] is None  # the absolute caps alone
    settings.EXECUTOR_HISTORY_DEFAULTS = {
        **settings.EXECUTOR_HISTORY_DEFAULTS,
        "max_tokens_fraction": 0.7,
    }
    settings.EXECUTOR_HISTORY_FROM_ENVIRONMENT = frozenset({"max_tokens_fraction"})
    response = staff_api.patch(
        "/api/policies/code/", {"inherit": ["max_tokens_fraction"]}, format="json"
    )
    assert (
        response.json()["max_tokens_fraction"],
        response.json()["sources"]["max_tokens_fraction"],
    ) == (0.7, "environment")
