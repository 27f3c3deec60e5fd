"""The executor API end to end over HTTP: claim, lease, progress, result, reclaim."""

from __future__ import annotations

import json
import logging
import re
from datetime import timedelta

import pytest
from django.db import connection
from django.utils import timezone

from backend.artifacts.models import Artifact
from backend.dispatch.models import HistoryPolicy, PromptReport
from backend.tasks.models import Subtask, Task
from backend.tasks.partial_texts import partial_text_of

pytestmark = [pytest.mark.django_db, pytest.mark.usefixtures("pipeline_bots")]

SINGLE = {"title": "Fix", "task_type": "code", "message": "CI is red.", "executor": "codex"}
PIPELINE = {
    "title": "Review",
    "task_type": "code",
    "message": "Add retries.",
    "pipeline": [
        {"bot": "coder", "executor": "codex"},
        {"bot": "reviewer", "executor": "claude_code"},
    ],
}


def create(api, body=SINGLE) -> dict:
    response = api.post("/api/tasks/", body, format="json")
    assert response.status_code == 201, response.json()
    return response.json()


def dispatch(client, kinds=("codex",), limit=5, worker_id="w1"):
    response = client.post(
        "/api/executor/dispatch/",
        {"kinds": list(kinds), "limit": limit, "worker_id": worker_id},
        format="json",
    )
    assert response.status_code == 200, response.json()
    return response.json()["turns"]


def report(client, turn, *, worker_id="w1", **body):
    body = {"worker_id": worker_id, "attempt": turn["attempt"], "status": "COMPLETED", **body}
    return client.post(f"/api/executor/subtasks/{turn['subtask_id']}/result/", body, format="json")


def test_claim_returns_the_payload_and_marks_the_turn_running(api, worker_api):
    task = create(api)
    [turn] = dispatch(worker_api)
    assert turn["task_id"] == task["id"]
    assert turn["message_id"] == 2
    assert turn["attempt"] == 1
    assert turn["prompt"] == "CI is red."
    assert turn["bot_config"] == {
        "bot": "codex",
        "executor": "codex",
        "model": "gpt-5.5",
        "instructions": "",
        "permission_mode": "full_access",
        "max_turns": None,
        "timeout_seconds": 1800,
        "context_window": 1_050_000,  # the model table's figure for gpt-5.5
        "context_passing": "original_and_previous",
        "pipeline_step": 0,
        "pipeline_length": 1,
    }
    assert turn["heartbeat_interval_seconds"] == 60  # a quarter of the 600 s lease, at most 60
    assert turn["prompt_report"]["bytes"] == len(b"CI is red.")
    assert turn["artifacts"] == []
    assert turn["native_session_id"] == ""
    assert turn["prompt_report"]["verbatim"] is True
    stored = Subtask.objects.get(pk=turn["subtask_id"])
    assert (stored.status, stored.lease_owner, stored.attempts) == ("RUNNING", "w1", 1)
    assert Task.objects.get(pk=task["id"]).status == "RUNNING"
    assert dispatch(worker_api) == []  # nothing left


def test_claims_respect_kinds_and_age(api, worker_api):
    first = create(api)
    create(api, {**SINGLE, "executor": "agno"})
    third = create(api)
    turns = dispatch(worker_api, kinds=["codex"], limit=10)
    assert [t["task_id"] for t in turns] == [first["id"], third["id"]]


def test_pipeline_step_waits_for_the_previous_one(api, worker_api):
    create(api, PIPELINE)
    [coder] = dispatch(worker_api, kinds=["codex", "claude_code"])
    assert dispatch(worker_api, kinds=["codex", "claude_code"]) == []
    assert report(worker_api, coder, result={"value": "patched"}).status_code == 200
    [reviewer] = dispatch(worker_api, kinds=["codex", "claude_code"])
    assert reviewer["bot"] == "reviewer"
    assert reviewer["prompt"].endswith("## Previous Result\n\nAssistant[coder]:\npatched\n")


def test_result_is_idempotent_and_conflicts_are_refused(api, worker_api):
    task = create(api)
    [turn] = dispatch(worker_api)
    first = report(worker_api, turn, result={"value": "done"}, usage={"input_tokens": 10})
    assert first.status_code == 200
    assert first.json()["changed"] is True
    again = report(worker_api, turn, result={"value": "done"}, usage={"input_tokens": 10})
    assert again.status_code == 200
    assert again.json()["changed"] is False
    different = report(worker_api, turn, result={"value": "other"})
    assert different.status_code == 409
    stored = Subtask.objects.get(pk=turn["subtask_id"])
    assert stored.result == {"value": "done"}
    assert Task.objects.get(pk=task["id"]).status == "COMPLETED"


def test_lost_lease_is_refused_and_changes_nothing(api, worker_api, settings):
    create(api)
    [turn] = dispatch(worker_api, worker_id="slow")
    Subtask.objects.filter(pk=turn["subtask_id"]).update(
        lease_expires_at=timezone.now() - timedelta(seconds=1)
    )
    [again] = dispatch(worker_api, worker_id="fast")  # reclaims, then claims anew
    assert again["subtask_id"] == turn["subtask_id"]
    assert again["attempt"] == 2
    late = report(worker_api, turn, worker_id="slow", result={"value": "late"})
    assert (late.status_code, late.json()["code"]) == (409, "lease_lost")
    assert "attempt 2 (worker 'fast') holds the turn now" in late.json()["detail"]
    heartbeat = worker_api.post(
        f"/api/executor/subtasks/{turn['subtask_id']}/heartbeat/",
        {"worker_id": "slow", "attempt": 1},
        format="json",
    )
    assert (heartbeat.status_code, heartbeat.json()["code"]) == (409, "lease_lost")
    stored = Subtask.objects.get(pk=turn["subtask_id"])
    assert (stored.status, stored.lease_owner, stored.result) == ("RUNNING", "fast", None)
    assert report(worker_api, again, worker_id="fast", result={"value": "ok"}).status_code == 200


def test_turn_fails_after_the_last_attempt(api, worker_api, settings):
    settings.BATON_MAX_ATTEMPTS = 2
    create(api)
    for _ in range(2):
        [turn] = dispatch(worker_api)
        Subtask.objects.filter(pk=turn["subtask_id"]).update(
            lease_expires_at=timezone.now() - timedelta(seconds=1)
        )
    assert dispatch(worker_api) == []
    stored = Subtask.objects.get(pk=turn["subtask_id"])
    assert stored.status == "FAILED"
    assert "lease expired on attempt 2 of 2" in stored.error


def test_heartbeat_extends_the_lease(api, worker_api):
    create(api)
    [turn] = dispatch(worker_api)
    Subtask.objects.filter(pk=turn["subtask_id"]).update(
        lease_expires_at=timezone.now() + timedelta(seconds=5)
    )
    response = worker_api.post(
        f"/api/executor/subtasks/{turn['subtask_id']}/heartbeat/",
        {"worker_id": "w1", "attempt": 1},
        format="json",
    )
    assert response.status_code == 200
    stored = Subtask.objects.get(pk=turn["subtask_id"])
    assert stored.lease_expires_at > timezone.now() + timedelta(seconds=60)


def test_progress_appends_events_and_keeps_the_partial_text(api, worker_api):
    create(api)
    [turn] = dispatch(worker_api)
    url = f"/api/executor/subtasks/{turn['subtask_id']}/progress/"
    for index in range(3):
        body = {
            "worker_id": "w1",
            "attempt": 1,
            "events": [{"type": "tool_call", "n": index}],
            "partial_text": f"working {index}",
        }
        assert worker_api.post(url, body, format="json").status_code == 200
    stored = Subtask.objects.get(pk=turn["subtask_id"])
    assert [event["n"] for event in stored.progress_events] == [0, 1, 2]
    assert partial_text_of(stored) == "working 2"
    # The product sees the progress while the turn runs.
    shown = api.get(f"/api/tasks/{turn['task_id']}/subtasks/").json()["results"][1]
    assert shown["status"] == "RUNNING"
    assert shown["partial_text"] == "working 2"
    assert [event["n"] for event in shown["progress_events"]] == [0, 1, 2]


def _post_progress(worker_api, turn, text: str) -> None:
    url = f"/api/executor/subtasks/{turn['subtask_id']}/progress/"
    body = {"worker_id": "w1", "attempt": 1, "events": [], "partial_text": text}
    assert worker_api.post(url, body, format="json").status_code == 200


def test_progress_extends_the_lease_only_when_it_is_due(api, worker_api):
    create(api)
    [turn] = dispatch(worker_api)
    claimed_until = Subtask.objects.get(pk=turn["subtask_id"]).lease_expires_at
    # Just claimed: the lease is not due, the progress is stored and the lease left alone.
    _post_progress(worker_api, turn, "working 1")
    stored = Subtask.objects.get(pk=turn["subtask_id"])
    assert (partial_text_of(stored), stored.lease_expires_at) == ("working 1", claimed_until)
    # Nearly over: a progress post extends it, as a heartbeat would.
    Subtask.objects.filter(pk=turn["subtask_id"]).update(
        lease_expires_at=timezone.now() + timedelta(seconds=5)
    )
    _post_progress(worker_api, turn, "working 2")
    stored = Subtask.objects.get(pk=turn["subtask_id"])
    assert partial_text_of(stored) == "working 2"
    assert stored.lease_expires_at > timezone.now() + timedelta(seconds=60)


def test_a_heartbeat_leaves_a_lease_that_is_not_due_alone(api, worker_api):
    create(api)
    [turn] = dispatch(worker_api)
    claimed_until = Subtask.objects.get(pk=turn["subtask_id"]).lease_expires_at
    response = worker_api.post(
        f"/api/executor/subtasks/{turn['subtask_id']}/heartbeat/",
        {"worker_id": "w1", "attempt": 1},
        format="json",
    )
    assert response.status_code == 200
    assert Subtask.objects.get(pk=turn["subtask_id"]).lease_expires_at == claimed_until


@pytest.mark.postgres_only
def test_a_progress_post_that_leaves_the_lease_is_a_heap_only_update(api, worker_api):
    """No indexed column of the turn changes, so PostgreSQL writes no index entry for it."""
    create(api)
    [turn] = dispatch(worker_api)
    before = _turn_updates()
    _post_progress(worker_api, turn, "working")
    updated, heap_only = (now - then for now, then in zip(_turn_updates(), before, strict=True))
    assert (updated, heap_only) == (1, 1)


def _turn_updates() -> tuple[int, int]:
    """The turn table's updates and heap-only updates so far in this transaction."""
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT n_tup_upd, n_tup_hot_upd FROM pg_stat_xact_user_tables WHERE relname = %s",
            [Subtask._meta.db_table],
        )
        row = cursor.fetchone()
    return (int(row[0]), int(row[1])) if row else (0, 0)


def test_bad_results_are_400_and_leave_the_claim_running(api, worker_api):
    create(api)
    [turn] = dispatch(worker_api)
    for body, field in [
        ({"result": [1, 2]}, "result"),
        ({"status": "FAILED"}, "error"),
        ({"status": "RETRY"}, "error"),
        ({"result": {"value": "x"}, "usage": {"input_tokens": -1}}, "usage.input_tokens"),
        ({"result": {"value": "x"}, "usage": {"tokens": 3}}, "usage.tokens"),
        ({"result": {"value": "x"}, "usage": [1]}, "usage"),
        ({"result": {"value": "x"}, "error_code": "Bad Code"}, "error_code"),
        ({"status": "DONE", "result": {"value": "x"}}, "status"),
        ({"result": {"value": "x"}, "colour": "red"}, "colour"),
    ]:
        response = report(worker_api, turn, **body)
        assert response.status_code == 400, (body, response.json())
        assert field in response.json()["fields"], response.json()
    stored = Subtask.objects.get(pk=turn["subtask_id"])
    assert (stored.status, stored.result) == ("RUNNING", None)


def test_result_over_the_limit_is_413(api, worker_api, settings):
    settings.BATON_MAX_RESULT_BYTES = 1_000
    create(api)
    [turn] = dispatch(worker_api)
    body = json.dumps(
        {"worker_id": "w1", "attempt": 1, "status": "COMPLETED", "result": {"value": "x" * 1_200}}
    )
    response = worker_api.post(
        f"/api/executor/subtasks/{turn['subtask_id']}/result/",
        body,
        content_type="application/json",
    )
    assert response.status_code == 413
    assert Subtask.objects.get(pk=turn["subtask_id"]).status == "RUNNING"


def test_workers_only_touch_their_own_claims(api, worker_api, other_worker_api):
    create(api)
    [turn] = dispatch(worker_api)
    response = report(other_worker_api, turn, result={"value": "mine now"})
    assert response.status_code == 404
    assert Subtask.objects.get(pk=turn["subtask_id"]).status == "RUNNING"


def test_product_clients_cannot_call_executor_endpoints_and_vice_versa(api, worker_api):
    create(api)
    response = api.post(
        "/api/executor/dispatch/", {"kinds": ["codex"], "worker_id": "x"}, format="json"
    )
    assert response.status_code == 403
    assert worker_api.get("/api/tasks/").status_code == 403
    assert Subtask.objects.filter(status="RUNNING").count() == 0


def test_dispatch_input_errors_name_the_field(worker_api):
    for body, field in [
        ({"kinds": ["gpt"], "worker_id": "w"}, "kinds.0"),
        ({"kinds": [], "worker_id": "w"}, "kinds"),
        ({"kinds": ["codex"], "worker_id": "w", "limit": 0}, "limit"),
        ({"kinds": ["codex"]}, "worker_id"),
    ]:
        response = worker_api.post("/api/executor/dispatch/", body, format="json")
        assert response.status_code == 400
        assert field in response.json()["fields"], response.json()


def test_prompt_report_and_log_line_carry_no_text(api, worker_api, caplog):
    secret = "the secret launch code is 0000"
    create(api, {**SINGLE, "message": secret})
    with caplog.at_level(logging.INFO, logger="baton.events"):
        [turn] = dispatch(worker_api)
    row = PromptReport.objects.get(subtask_id=turn["subtask_id"])
    assert (row.policy.task_type, row.policy_version, row.attempt) == ("code", 1, 1)
    assert row.tokens == turn["prompt_report"]["tokens"] > 0
    [line] = [r.getMessage() for r in caplog.records if '"event": "dispatch"' in r.getMessage()]
    logged = json.loads(line)
    assert logged["subtask"] == turn["subtask_id"]
    assert logged["policy_version"] == 1
    assert secret not in caplog.text
    assert "launch" not in json.dumps([f.value for f in row._meta.fields if hasattr(f, "value")])


def test_the_dispatch_line_is_derived_from_the_prompt_report_row(api, worker_api, caplog):
    """Every column of the row is logged (a list as its length), so a column added to the
    row appears in the log line without a second copy."""
    task = create(api)
    [turn] = dispatch(worker_api)
    report(worker_api, turn, result={"value": "first answer"})
    api.post(f"/api/tasks/{task['id']}/messages/", {"message": "second"}, format="json")
    with caplog.at_level(logging.INFO, logger="baton.events"):
        [turn] = dispatch(worker_api)
    row = PromptReport.objects.get(subtask_id=turn["subtask_id"])
    [line] = [r.getMessage() for r in caplog.records if '"message_id": 4' in r.getMessage()]
    logged = json.loads(line)
    assert logged["event"] == "dispatch"
    for column in PromptReport._meta.concrete_fields:
        if column.name in {
            "id",
            "created_at",
            "sent",
            "policy_snapshot",
            "input_snapshot",
            "prompt_sha256",
        }:
            assert column.name not in logged
            continue
        value = getattr(row, column.attname)
        assert logged[column.name] == (len(value) if isinstance(value, list) else value)
    assert logged["included_message_ids"] == 2 and logged["sections"] >= 2
    assert (logged["message_id"], logged["executor"]) == (turn["message_id"], "codex")


def test_policy_change_applies_to_the_next_dispatch(api, worker_api):
    task = create(api)
    for number in range(4):
        [turn] = dispatch(worker_api)
        assert report(worker_api, turn, result={"value": f"answer {number}"}).status_code == 200
        api.post(f"/api/tasks/{task['id']}/messages/", {"message": f"q{number}"}, format="json")
    HistoryPolicy.objects.filter(task_type="code").update(
        max_messages=3, overrides=["max_messages"], version=2
    )
    [turn] = dispatch(worker_api)
    # The pinned first message and the newest whole round.
    assert turn["prompt_report"]["messages_included"] == 3
    assert "[omitted earlier messages: 5 (2 user, 3 assistant)]" in turn["prompt"]


def test_kill_switch_sends_the_current_message_only(api, worker_api, settings):
    task = create(api)
    [turn] = dispatch(worker_api)
    report(worker_api, turn, result={"value": "first answer"})
    api.post(f"/api/tasks/{task['id']}/messages/", {"message": "second"}, format="json")
    settings.EXECUTOR_HISTORY_ENABLED = False
    [turn] = dispatch(worker_api)
    assert turn["prompt"] == "second"


def test_failed_payload_build_rolls_the_claim_back(api, worker_api, monkeypatch):
    create(api)
    import backend.dispatch.payload as dispatch_payload

    def broken(**kwargs):
        raise RuntimeError("content that must not be logged")

    monkeypatch.setattr(dispatch_payload, "build_turn_prompt", broken)
    assert dispatch(worker_api) == []
    stored = Subtask.objects.get(role="ASSISTANT")
    assert (stored.status, stored.attempts, stored.error_code) == (
        "PENDING",
        1,
        "prompt_build_failed",
    )
    monkeypatch.undo()
    [turn] = dispatch(worker_api)
    assert turn["attempt"] == 2


def test_native_session_id_is_offered_for_resume(api, worker_api):
    task = create(api)
    [turn] = dispatch(worker_api)
    report(worker_api, turn, result={"value": "ok"}, native_session_id="sess-123")
    api.post(f"/api/tasks/{task['id']}/messages/", {"message": "more"}, format="json")
    [turn] = dispatch(worker_api)
    assert turn["native_session_id"] == "sess-123"


def test_spilled_history_comes_with_its_manifest(api, worker_api, settings):
    settings.BATON_SPILL_THRESHOLD_CHARS = 1_000
    settings.BATON_PREVIEW_HEAD_CHARS = settings.BATON_PREVIEW_TAIL_CHARS = 50
    task = create(api)
    [turn] = dispatch(worker_api)
    report(worker_api, turn, result={"value": "log line\n" * 500})
    api.post(f"/api/tasks/{task['id']}/messages/", {"message": "and?"}, format="json")
    [turn] = dispatch(worker_api)
    [entry] = turn["artifacts"]
    assert entry["path"] == f".baton/artifacts/{entry['id']}.txt"
    assert entry["size_chars"] == 4_500
    artifact = Artifact.objects.get(pk=entry["id"])
    assert entry == {
        "id": artifact.id,
        "sha256": artifact.sha256,
        "kind": artifact.kind,
        "size_bytes": artifact.size_bytes,
        "size_chars": 4_500,
        "size_lines": 500,
        "path": f".baton/artifacts/{artifact.id}.txt",
        "download_url": f"http://testserver/api/artifacts/{artifact.id}/content/",
        "parts": None,
    }
    assert (turn["manifest_version"], turn["artifact_lists"]) == (1, [])
    assert f"full text: .baton/artifacts/{entry['id']}.txt]" in turn["prompt"]


def test_workers_read_artifacts_only_of_tasks_they_hold(
    api, worker_api, other_worker_api, settings
):
    settings.BATON_SPILL_THRESHOLD_CHARS = 1_000
    settings.BATON_PREVIEW_HEAD_CHARS = settings.BATON_PREVIEW_TAIL_CHARS = 50
    task = create(api)
    [turn] = dispatch(worker_api)
    report(worker_api, turn, result={"value": "log line\n" * 500})
    [entry] = [Subtask.objects.get(pk=turn["subtask_id"]).artifact_id]
    url = f"/api/artifacts/{entry}/content/"
    # Finished claim: the worker holds nothing on this task any more.
    assert worker_api.get(url).status_code == 404
    api.post(f"/api/tasks/{task['id']}/messages/", {"message": "and?"}, format="json")
    [turn] = dispatch(worker_api)
    response = worker_api.get(url)
    assert response.status_code == 200
    assert b"".join(response.streaming_content) == ("log line\n" * 500).encode()
    assert other_worker_api.get(url).status_code == 404
    owner_read = api.get(url)
    assert owner_read.status_code == 200  # the task's owner
    owner_read.close()  # unread: close it as a server would, which closes the stored file


def test_a_50_mb_result_is_accepted_and_reads_back_whole(api, worker_api):
    create(api)
    [turn] = dispatch(worker_api)
    value = ("0123456789abcdef" * 4 + "\n") * (50 * 1024 * 1024 // 65)
    response = report(worker_api, turn, result={"value": value, "exit_code": 0})
    assert response.status_code == 200, response.json()
    stored = Subtask.objects.get(pk=turn["subtask_id"])
    assert stored.result == {"value": None, "exit_code": 0}  # the row stays small
    assert stored.history_chars == len(value)
    assert len(stored.history_text) < 5_000
    listed = api.get(f"/api/tasks/{turn['task_id']}/subtasks/")
    assert len(listed.content) < 20_000  # the value's preview, not the value
    shown = listed.json()["results"][1]["result"]
    assert shown["exit_code"] == 0
    whole = api.get(shown["value"]["url"])
    assert b"".join(whole.streaming_content) == value.encode()


def test_turns_report_what_ingestion_measured(api, worker_api):
    task = create(api)
    [turn] = dispatch(worker_api)
    body = {"worker_id": "w1", "attempt": 1, "status": "COMPLETED"}
    body["result"] = {"value": "bad \ud800 char\nline two"}
    response = worker_api.post(
        f"/api/executor/subtasks/{turn['subtask_id']}/result/",
        json.dumps(body),  # ASCII escapes: the lone surrogate travels as \ud800
        content_type="application/json",
    )
    assert response.status_code == 200, response.json()
    user_turn, answer = api.get(f"/api/tasks/{task['id']}/subtasks/").json()["results"]
    assert user_turn["history"]["chars"] == len("CI is red.")
    assert answer["history"] == {
        "chars": 19,
        "bytes": 21,
        "lines": 2,
        "tokens": answer["history"]["tokens"],
        "tokens_estimated": False,
        "replaced_chars": 1,
        "artifact": None,
    }
    assert answer["result"] == {"value": "bad \ud800 char\nline two"}


def test_policy_decides_context_passing_unless_the_step_sets_it(api, worker_api):
    steps = [{"bot": "coder", "executor": "codex"}, {"bot": "builder", "executor": "codex"}]
    create(api, {**PIPELINE, "pipeline": steps})
    HistoryPolicy.objects.filter(task_type="code").update(
        context_passing="previous_bot", overrides=["context_passing"]
    )
    [coder] = dispatch(worker_api)
    report(worker_api, coder, result={"value": "patched"})
    [reviewer] = dispatch(worker_api)
    assert reviewer["bot_config"]["context_passing"] == "previous_bot"
    assert "## Current Message" not in reviewer["prompt"]
    assert reviewer["prompt"].endswith("## Previous Result\n\nAssistant[coder]:\npatched\n")

    steps[1]["context_passing"] = "original_and_previous"
    create(api, {**PIPELINE, "pipeline": steps})
    [coder] = dispatch(worker_api)
    report(worker_api, coder, result={"value": "patched"})
    [reviewer] = dispatch(worker_api)
    assert reviewer["bot_config"]["context_passing"] == "original_and_previous"
    assert "## Current Message" in reviewer["prompt"]


def test_a_worker_id_that_is_not_an_identifier_is_logged_opaque(api, worker_api, caplog):
    create(api)
    with caplog.at_level(logging.INFO, logger="baton.events"):
        [turn] = dispatch(worker_api, worker_id="Alice's laptop, worker 2")
    reported = report(
        worker_api, turn, worker_id="Alice's laptop, worker 2", result={"value": "ok"}
    )
    assert reported.status_code == 200
    [line] = [r.getMessage() for r in caplog.records if '"event": "dispatch"' in r.getMessage()]
    assert json.loads(line)["worker_id"].startswith("sha256:")
    assert "Alice" not in caplog.text


_POINTER = re.compile(r"^\[artifact (\w+) · .* · full text: (\S+)\]$", re.MULTILINE)


def _pointed_texts(worker_api, turn) -> dict[str, str]:
    """Each pointer line's artifact, fetched through the manifest's download URL."""
    manifest = {entry["id"]: entry for entry in turn["artifacts"]}
    texts = {}
    for artifact_id, path in _POINTER.findall(turn["prompt"]):
        entry = manifest[artifact_id]  # every pointer's artifact is in the manifest
        assert entry["path"] == path
        response = worker_api.get(entry["download_url"])
        texts[artifact_id] = b"".join(response.streaming_content).decode()
    return texts


def test_every_cut_section_points_to_its_whole_text_in_the_manifest(api, worker_api):
    """A 1 MiB message and a 70,000-char first pipeline answer both reach the next prompts as
    cuts whose pointer lines name manifest artifacts holding exactly the original text."""
    message = "Please look at this log.\n" + "a log line that is long enough\n" * 33_000
    message = message[: 1024 * 1024 - 1]
    task = create(api, {**PIPELINE, "message": message})
    [coder] = dispatch(worker_api)
    assert coder["prompt_report"]["current_truncated"]
    assert list(_pointed_texts(worker_api, coder).values()) == [message]

    answer = "".join(f"changed line {n}\n" for n in range(5_000))[:70_000]
    assert report(worker_api, coder, result={"value": answer}).status_code == 200
    [reviewer] = dispatch(worker_api, kinds=("claude_code",))
    report_ = reviewer["prompt_report"]
    assert report_["current_truncated"] and report_["previous_result_truncated"]
    assert sorted(_pointed_texts(worker_api, reviewer).values()) == sorted([message, answer])
    # The stored report (and so the dispatch log line) counts the cuts of every section.
    row = PromptReport.objects.get(subtask_id=reviewer["subtask_id"], kind="full")
    assert (row.task_id, row.truncated_count) == (task["id"], 2)
    assert (row.current_truncated, row.previous_result_truncated) == (True, True)
    # Cut on line boundaries: at most one line (31 chars) short of the cap at each end.
    assert 0 <= row.current_removed_chars - (len(message) - 32_000) <= 2 * 31
    coder_turn = Subtask.objects.get(pk=coder["subtask_id"])
    kept = len(coder_turn.preview_head) + len(coder_turn.preview_tail)
    assert coder_turn.preview_head.endswith("\n")  # cut on a line boundary
    assert row.previous_result_removed_chars == len(answer) - kept > len(answer) - 4_000


def resumed_dispatch(api, worker_api) -> tuple[dict, dict]:
    """A task whose coder's second turn was offered a resume: the task and that claim."""
    task = create(api, PIPELINE)
    [coder] = dispatch(worker_api)
    report(worker_api, coder, result={"value": "patched"}, native_session_id="sess-1")
    [reviewer] = dispatch(worker_api, kinds=("claude_code",))
    report(worker_api, reviewer, result={"value": "looks good"})
    api.post(f"/api/tasks/{task['id']}/messages/", {"message": "ship it"}, format="json")
    [coder] = dispatch(worker_api)
    assert coder["resume_prompt"]
    return task, coder
