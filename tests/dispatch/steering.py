"""Steers made through the real API, for tests: a follow-up sent with strategy steer to a
task's running turn, and the worker's heartbeat saying what became of it."""

from __future__ import annotations

from typing import Any


def steer(api: Any, task: dict[str, Any], message: str, **extra: Any) -> dict[str, Any]:
    """Send `message` to the task's running turn; the answer (202) names its steer."""
    response = api.post(
        f"/api/tasks/{task['id']}/messages/",
        {"message": message, "strategy": "steer", **extra},
        format="json",
    )
    assert response.status_code == 202, response.json()
    body: dict[str, Any] = response.json()
    assert body.get("steered") is True, body
    return body


def settle(
    worker_api: Any,
    turn: dict[str, Any],
    steer_id: int,
    *,
    refusal: str | None = None,
    worker_id: str = "w1",
) -> None:
    """The heartbeat of the worker holding `turn`: its executor received the steer, or
    (`refusal`) could not take it."""
    result: dict[str, Any] = {"steer_id": steer_id, "delivered": refusal is None}
    if refusal is not None:
        result["refusal"] = refusal
    response = worker_api.post(
        "/api/executor/heartbeat/",
        {
            "worker_id": worker_id,
            "turns": [
                {"subtask_id": turn["subtask_id"], "attempt": turn["attempt"], "steers": [result]}
            ],
        },
        format="json",
    )
    assert response.status_code == 200, response.json()
