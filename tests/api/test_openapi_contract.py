"""The OpenAPI schema is a contract every answer keeps, checked against a live server.

Schemathesis reads the schema the server serves (`/api/schema/`), generates requests from it —
valid ones and invalid ones — and sends them over real HTTP to pytest-django's live server on
127.0.0.1, as a product account (the task API), an executor worker (the executor API) and an
operator (the policy API). Every answer must be no server error, have a status code the schema
lists for the operation, the content type it declares for that status, and a body its schema
describes. Generation is bounded per operation and derandomized with a fixed seed, so a run
sends the same requests every time and takes well under a minute or two.

The ids the generator would invent are mostly unknown (404s); a dictionary of the ids this test
creates (a task with its turns, a queued message, a webhook endpoint, a bot, an artifact) is
drawn from half of the time, so the schema of the success answers is checked too.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import httpx
import pytest
import schemathesis
from django.contrib.auth import get_user_model
from django.test import Client
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from rest_framework.authtoken.models import Token
from schemathesis.checks import not_a_server_error
from schemathesis.specs.openapi.checks import (
    content_type_conformance,
    response_schema_conformance,
    status_code_conformance,
)

from backend.dispatch.workers import ensure_worker_account

pytestmark = [pytest.mark.e2e]

SEED = 20260101
# Generated cases per operation and generation mode (valid and invalid data). The schema has
# about 30 operations; this keeps the test's runtime near a minute on a 2-core machine.
MAX_EXAMPLES = 20
CHECKS = [
    not_a_server_error,
    status_code_conformance,
    content_type_conformance,
    response_schema_conformance,
]


@dataclass(frozen=True)
class Accounts:
    product: str
    worker: str
    operator: str

    def token_for(self, path: str) -> str:
        if path.startswith("/api/executor/"):
            return self.worker
        if path.startswith("/api/policies/"):
            return self.operator
        return self.product


@dataclass(frozen=True)
class KnownIds:
    """Rows that exist on the live server, for the generator to name now and then."""

    task_ids: list[int]
    subtask_ids: list[int]
    queued_ids: list[int]
    endpoint_ids: list[int]
    artifact_ids: list[str]
    bot_names: list[str]
    policy_names: list[str]

    def by_parameter(self) -> dict[str, list[Any]]:
        return {
            "task_id": self.task_ids,
            "subtask_id": self.subtask_ids,
            "queued_id": self.queued_ids,
            "endpoint_id": self.endpoint_ids,
            "artifact_id": self.artifact_ids,
            "name": [*self.bot_names, *self.policy_names],
        }


@pytest.fixture
def accounts(live_server, shipped_bots, settings) -> Accounts:
    # An event stream stays open this long (the live server shares these settings).
    settings.BATON_EVENT_STREAM_SECONDS = 1
    users = get_user_model().objects
    product = users.create_user(username="contract-product")
    operator = users.create_user(username="contract-operator", is_staff=True)
    _, worker_token = ensure_worker_account(username="contract-worker")
    return Accounts(
        product=Token.objects.create(user=product).key,
        worker=worker_token,
        operator=Token.objects.create(user=operator).key,
    )


@pytest.fixture
def known_ids(live_server, accounts: Accounts) -> Iterator[KnownIds]:
    headers = {"Authorization": f"Token {accounts.product}"}
    with httpx.Client(base_url=live_server.url, headers=headers, timeout=30) as product:
        created = product.post(
            "/api/tasks/",
            json={
                "title": "contract",
                "task_type": "code",
                "executor": "codex",
                "message": "x" * 70_000,
            },
        )
        assert created.status_code == 201, created.text
        task = created.json()
        queued = product.post(
            f"/api/tasks/{task['id']}/messages/",
            json={"message": "later", "strategy": "enqueue"},
        )
        assert queued.status_code == 202, queued.text
        endpoint = product.post("/api/webhooks/", json={"url": "https://hooks.example.com/baton"})
        assert endpoint.status_code == 201, endpoint.text
        spilled = task["turns"][0]["artifact"]
        assert spilled, task["turns"][0]
        yield KnownIds(
            task_ids=[task["id"]],
            subtask_ids=[turn["id"] for turn in task["turns"]],
            queued_ids=[queued.json()["id"]],
            endpoint_ids=[endpoint.json()["id"]],
            artifact_ids=[spilled],
            bot_names=[task["pipeline"][0]["bot"]],
            policy_names=["default", "code"],
        )


def served_schema() -> dict[str, Any]:
    """The schema exactly as `/api/schema/` serves it (read once, when the module loads: the
    test items are one per operation)."""
    answer = Client().get("/api/schema/", HTTP_ACCEPT="application/vnd.oai.openapi+json")
    assert answer.status_code == 200, answer.content[:200]
    return json.loads(answer.content)


CONFIG = schemathesis.Config.from_dict(
    {
        "seed": SEED,
        # An event stream's answer is read this far, and checked event by event.
        "max-stream-events": 5,
        "generation": {
            "mode": "all",
            "max-examples": MAX_EXAMPLES,
            "deterministic": True,
            "database": "none",
        },
        "phases": {"stateful": {"enabled": False}, "coverage": {"enabled": False}},
    }
)
schema = schemathesis.openapi.from_dict(served_schema(), config=CONFIG)


def known_value(data: st.DataObject, name: str, generated: Any, known: KnownIds) -> Any:
    """The generated value, or now and then one that names a row of the live server."""
    rows = known.by_parameter().get(name)
    if not rows:
        return generated
    return data.draw(st.sampled_from([generated, *rows]), label=name)


@schema.parametrize()
@schema.given(data=st.data())
# The accounts and rows are made once per operation, and its generated requests share them.
@settings(suppress_health_check=[HealthCheck.function_scoped_fixture])
def test_every_answer_keeps_the_schema(case, data, live_server, accounts, known_ids):
    if case.path_parameters:
        case.path_parameters = {
            name: known_value(data, name, value, known_ids)
            for name, value in case.path_parameters.items()
        }
    case.call_and_validate(
        base_url=live_server.url,
        headers={"Authorization": f"Token {accounts.token_for(case.path)}"},
        checks=CHECKS,
        timeout=30,
    )
