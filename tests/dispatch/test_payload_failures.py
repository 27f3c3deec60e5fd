"""A claimed turn whose payload cannot be built, at whichever stage, is released at once.

The batch's stages (sessions, transcripts, whole texts, manifest) release every turn they were
building; a failure reading the batch's prompt inputs releases none, each turn's input then
being read alone. The log line names the exception's type only, never its text.
"""

from __future__ import annotations

import logging

import pytest
from django.db import connection

import backend.dispatch.payload as payload
from backend.tasks.models import Subtask
from tests.dispatch.test_dispatch_api import create, dispatch

pytestmark = [pytest.mark.django_db, pytest.mark.usefixtures("pipeline_bots")]

SECRET = "content that must not be logged"


def broken(*args, **kwargs):
    raise RuntimeError(SECRET)


def released() -> list[tuple[str, int, str]]:
    return sorted(
        Subtask.objects.filter(role="ASSISTANT").values_list("status", "attempts", "error_code")
    )


@pytest.mark.parametrize(
    "stage",
    ["native_sessions_for", "transcripts_for", "store_whole_texts", "artifacts_to_list"],
)
def test_a_failed_stage_of_the_batch_releases_every_turn_it_built(
    api, worker_api, monkeypatch, caplog, stage
):
    if stage == "native_sessions_for" and connection.vendor == "postgresql":
        pytest.skip("the claim statement returned the claimed turns' sessions")
    create(api)
    create(api)
    monkeypatch.setattr(payload, stage, broken)
    with caplog.at_level(logging.INFO, logger="baton.events"):
        assert dispatch(worker_api) == []
    assert released() == [("PENDING", 1, "prompt_build_failed")] * 2
    lines = [r.getMessage() for r in caplog.records if "dispatch_build_failed" in r.getMessage()]
    assert len(lines) == 2
    assert SECRET not in caplog.text
    monkeypatch.undo()
    assert [turn["attempt"] for turn in dispatch(worker_api)] == [2, 2]


def test_a_failed_read_of_the_batchs_inputs_reads_each_turns_alone(api, worker_api, monkeypatch):
    create(api)
    create(api)
    monkeypatch.setattr(payload, "prompt_inputs_for", broken)
    turns = dispatch(worker_api)
    assert [turn["prompt"] for turn in turns] == ["CI is red.", "CI is red."]
    assert released() == [("RUNNING", 1, "")] * 2


def test_a_turn_that_fails_alone_is_released_alone(api, worker_api, monkeypatch):
    first, second = create(api), create(api)
    original = payload.build_turn_prompt

    def fails_for_the_first(**kwargs):
        if kwargs["task"].pk == first["id"]:
            raise RuntimeError(SECRET)
        return original(**kwargs)

    monkeypatch.setattr(payload, "build_turn_prompt", fails_for_the_first)
    [turn] = dispatch(worker_api)
    assert turn["task_id"] == second["id"]
    assert released() == [("PENDING", 1, "prompt_build_failed"), ("RUNNING", 1, "")]


def test_the_claimed_rows_are_read_without_their_long_columns(api, worker_api, monkeypatch):
    """The payload reads the claimed rows itself where the claim did not return them (SQLite):
    one query, oldest first, with their tasks and without the columns it never reads."""
    create(api)
    create(api)
    read = []
    original = payload._read_claimed

    def reading(ids):
        rows = original(ids)
        read.extend(rows)
        return rows

    monkeypatch.setattr(payload, "_read_claimed", reading)
    turns = dispatch(worker_api)
    if not read:
        pytest.skip("the claim statement returned the claimed rows (PostgreSQL)")
    assert [row.pk for row in read] == [turn["subtask_id"] for turn in turns]
    for row in read:
        assert row.get_deferred_fields() == set(payload._LONG_COLUMNS)
        assert "task" in row._state.fields_cache
