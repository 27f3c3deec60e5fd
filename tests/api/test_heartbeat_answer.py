"""The batched heartbeat's answer is `HeartbeatOutput`'s representation, written out."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta, timezone

from backend.api.executor_serializers import HeartbeatOutput
from backend.api.executor_views import heartbeat_answer
from backend.dispatch.heartbeats import ProgressOutcome
from backend.dispatch.leases import (
    CANCELLED,
    FINISHED,
    LEASE_LOST,
    RUNNING,
    LeaseState,
    heartbeat_interval_seconds,
)
from backend.tasks.services.steering import SteerOffer

STATES = [
    LeaseState(7, 1, RUNNING, datetime(2026, 12, 4, 19, 0, 5, 123456, tzinfo=UTC)),
    LeaseState(8, 2, RUNNING, datetime(2026, 12, 4, 21, 0, tzinfo=timezone(timedelta(hours=2)))),
    LeaseState(9, 1, CANCELLED, datetime(2026, 12, 4, 19, 0, tzinfo=UTC)),
    LeaseState(10, 3, LEASE_LOST, None),
    LeaseState(11, 1, FINISHED, None),
    LeaseState(
        12,
        1,
        RUNNING,
        datetime(2026, 12, 4, 19, 0, tzinfo=UTC),
        steers=(SteerOffer(3, "also cover the Windows path"), SteerOffer(5, "and\nthis")),
    ),
]


def represented(state: LeaseState) -> dict:
    """What the serializer is given for a state: its steers as dicts, none when it has none."""
    turn = vars(state).copy()
    steers = turn.pop("steers")
    if steers:
        turn["steers"] = [vars(offer) for offer in steers]
    return turn


def test_the_answer_is_what_the_serializer_represents():
    answer = heartbeat_answer(STATES)
    assert (
        answer
        == HeartbeatOutput(
            {
                "turns": [represented(state) for state in STATES],
                "heartbeat_interval_seconds": heartbeat_interval_seconds(),
            }
        ).data
    )
    assert answer["turns"][0] == {
        "subtask_id": 7,
        "attempt": 1,
        "state": "running",
        "lease_expires_at": "2026-12-04T19:00:05.123456Z",
    }
    assert answer["turns"][1]["lease_expires_at"] == "2026-12-04T19:00:00Z"
    assert answer["turns"][5]["steers"] == [
        {"steer_id": 3, "message": "also cover the Windows path"},
        {"steer_id": 5, "message": "and\nthis"},
    ]


def test_no_claims_is_an_empty_list():
    assert heartbeat_answer([])["turns"] == []


PROGRESS = {
    (7, 1): ProgressOutcome(stored=True, partial_text_chars=1200),
    (8, 2): ProgressOutcome(
        stored=False,
        partial_text_chars=40,
        code="partial_text_mismatch",
        detail="The stored partial text has 40 chars, not 38.",
    ),
    (9, 1): ProgressOutcome(stored=False, code="cancelled", detail="Turn 9 was cancelled."),
}


def test_progress_outcomes_are_what_the_serializer_represents():
    answer = heartbeat_answer(STATES, PROGRESS)
    turns = []
    for state in STATES:
        turn = represented(state)
        if (outcome := PROGRESS.get((state.subtask_id, state.attempt))) is not None:
            turn["progress"] = vars(outcome)
        turns.append(turn)
    assert (
        answer
        == HeartbeatOutput(
            {"turns": turns, "heartbeat_interval_seconds": heartbeat_interval_seconds()}
        ).data
    )
    assert answer["turns"][0]["progress"] == {
        "stored": True,
        "partial_text_chars": 1200,
        "code": None,
        "detail": None,
    }
    assert answer["turns"][1]["progress"]["code"] == "partial_text_mismatch"
    assert "progress" not in answer["turns"][3]  # sent none
