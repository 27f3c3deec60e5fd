"""Prompt reports in the task API: each assistant turn links its reports, and a report is read
by whoever may read its task, or by the worker whose claim it was handed, and by no one else."""

from __future__ import annotations

import pytest
from django.core.management import call_command
from rest_framework import serializers

from backend.dispatch.models import PromptReport
from backend.tasks.models import Steer
from tests.dispatch.steering import settle, steer
from tests.dispatch.test_dispatch_api import create, dispatch, report, resumed_dispatch

pytestmark = [pytest.mark.django_db, pytest.mark.usefixtures("pipeline_bots")]


def test_each_assistant_turn_links_its_reports_and_a_resumed_dispatch_links_two(api, worker_api):
    task, coder = resumed_dispatch(api, worker_api)
    turns = {turn["id"]: turn for turn in api.get(f"/api/tasks/{task['id']}/").json()["turns"]}
    rows = PromptReport.objects.filter(subtask_id=coder["subtask_id"]).order_by("created_at", "id")
    links = turns[coder["subtask_id"]]["prompt_reports"]
    assert [(link["id"], link["attempt"], link["kind"], link["sent"]) for link in links] == [
        (row.pk, 1, row.kind, None) for row in rows
    ]
    assert {link["kind"] for link in links} == {"full", "resume"}
    assert links[0]["url"] == f"http://testserver/api/prompt-reports/{links[0]['id']}/"
    assert [turn["prompt_reports"] for turn in turns.values() if turn["role"] == "USER"] == [
        [],
        [],
    ]
    paged = api.get(f"/api/tasks/{task['id']}/subtasks/").json()["results"]
    assert [turn["prompt_reports"] for turn in paged] == [
        turn["prompt_reports"] for turn in turns.values()
    ]


def test_the_owner_reads_a_report_with_its_turns_names(api, worker_api):
    task, coder = resumed_dispatch(api, worker_api)
    row = PromptReport.objects.get(subtask_id=coder["subtask_id"], kind="full")
    body = api.get(f"/api/prompt-reports/{row.pk}/").json()
    assert {key: body[key] for key in ("id", "task_id", "subtask_id", "message_id")} == {
        "id": row.pk,
        "task_id": task["id"],
        "subtask_id": coder["subtask_id"],
        "message_id": coder["message_id"],
    }
    assert body["attempt"] == 1
    assert (body["kind"], body["sent"], body["resume_reason"]) == ("full", None, "resume")
    assert body["tokens"] == row.tokens
    assert body["chars"] == row.chars
    assert body["messages_included"] == row.messages_included
    assert body["prompt_sha256"] == row.prompt_sha256
    assert body["builder_version"] == row.builder_version
    assert "prompt" not in body
    assert "input_snapshot" not in body
    assert body["steers"] == []


def test_a_report_lists_the_steers_its_claim_was_given(api, worker_api, django_assert_num_queries):
    task = create(api)
    [turn] = dispatch(worker_api)
    received = steer(api, task, "And the docs.")
    refused = steer(api, task, "And lint.")
    waiting = steer(api, task, "And ship.")
    settle(worker_api, turn, received["steer_id"])
    settle(worker_api, turn, refused["steer_id"], refusal="finished")
    row = PromptReport.objects.get(subtask_id=turn["subtask_id"])
    # The report, then its claim's steers (the caller's token is known by now).
    with django_assert_num_queries(2):
        body = api.get(f"/api/prompt-reports/{row.pk}/").json()
    delivered_at = Steer.objects.get(pk=received["steer_id"]).delivered_at
    assert body["steers"] == [
        {
            "steer_id": received["steer_id"],
            "message_id": 3,
            "status": "delivered",
            "delivered_at": serializers.DateTimeField().to_representation(delivered_at),
            "fallback_reason": "",
        },
        {
            "steer_id": refused["steer_id"],
            "message_id": 4,
            "status": "queued",
            "delivered_at": None,
            "fallback_reason": "finished",
        },
        {
            "steer_id": waiting["steer_id"],
            "message_id": 5,
            "status": "pending",
            "delivered_at": None,
            "fallback_reason": "",
        },
    ]


def test_another_account_gets_404(api, other_api, worker_api):
    create(api)
    [turn] = dispatch(worker_api)
    row = PromptReport.objects.get(subtask_id=turn["subtask_id"])
    response = other_api.get(f"/api/prompt-reports/{row.pk}/")
    assert response.status_code == 404
    assert response.json()["code"] == "not_found"


def test_an_operator_with_the_tasks_view_permission_reads_it(api, staff_api, worker_api):
    create(api)
    [turn] = dispatch(worker_api)
    row = PromptReport.objects.get(subtask_id=turn["subtask_id"])
    assert staff_api.get(f"/api/prompt-reports/{row.pk}/").json()["id"] == row.pk


def test_a_worker_reads_its_own_claims_reports_and_no_others(api, worker_api, other_worker_api):
    create(api)
    [turn] = dispatch(worker_api)
    row = PromptReport.objects.get(subtask_id=turn["subtask_id"])
    assert worker_api.get(f"/api/prompt-reports/{row.pk}/").status_code == 200
    assert other_worker_api.get(f"/api/prompt-reports/{row.pk}/").status_code == 404


def test_an_unknown_report_is_404(api):
    assert api.get("/api/prompt-reports/999999/").status_code == 404


def test_the_schema_has_the_endpoint_and_the_turns_links(api):
    schema = api.get("/api/schema/", HTTP_ACCEPT="application/vnd.oai.openapi+json").json()
    operation = schema["paths"]["/api/prompt-reports/{report_id}/"]["get"]
    assert operation["operationId"] == "prompt_reports_retrieve"
    assert {"200", "401", "404"} <= set(operation["responses"])
    report_fields = schema["components"]["schemas"]["PromptReportOutput"]["properties"]
    assert {"id", "task_id", "subtask_id", "message_id", "attempt", "kind", "sent"} <= set(
        report_fields
    )
    assert report_fields["steers"]["items"]["$ref"].endswith("PromptReportSteerOutput")
    steer_schema = schema["components"]["schemas"]["PromptReportSteerOutput"]
    assert set(steer_schema["properties"]) == {
        "steer_id",
        "message_id",
        "status",
        "delivered_at",
        "fallback_reason",
    }
    assert steer_schema["properties"]["delivered_at"]["nullable"] is True
    turn_fields = schema["components"]["schemas"]["SubtaskOutput"]["properties"]
    assert turn_fields["prompt_reports"]["items"]["$ref"].endswith("PromptReportLinkOutput")


@pytest.mark.parametrize("rounds", [1, 6])
def test_task_detail_query_count_does_not_grow_with_turns_and_reports(
    api, worker_api, django_assert_num_queries, rounds
):
    task = create(api)
    for number in range(rounds):
        [turn] = dispatch(worker_api)
        report(worker_api, turn, result={"value": f"answer {number}"})
        api.post(f"/api/tasks/{task['id']}/messages/", {"message": "more"}, format="json")
    assert PromptReport.objects.filter(task_id=task["id"]).count() == rounds
    # task with owner, turns, their report links, queued messages
    with django_assert_num_queries(4):
        body = api.get(f"/api/tasks/{task['id']}/").json()
    assert sum(len(turn["prompt_reports"]) for turn in body["turns"]) == rounds


def test_a_report_id_from_the_api_replays(api, worker_api, capsys):
    task = create(api)
    [turn] = dispatch(worker_api)
    [link] = next(
        t["prompt_reports"]
        for t in api.get(f"/api/tasks/{task['id']}/").json()["turns"]
        if t["id"] == turn["subtask_id"]
    )
    call_command("replay_prompt", link["id"])
    assert "sha256 matches" in capsys.readouterr().out
