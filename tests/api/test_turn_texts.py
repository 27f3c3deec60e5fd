"""Spilled texts on the task API over HTTP: previews in the views, whole texts streamed per
turn, pages bounded in bytes, and damaged artifacts that hide nothing."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from urllib.parse import parse_qs, urlsplit

import pytest
from django.db import connection
from django.http import StreamingHttpResponse

from backend.artifacts.models import Artifact
from backend.prompting.truncate import truncation_marker
from backend.tasks.models import Subtask

pytestmark = [pytest.mark.django_db, pytest.mark.usefixtures("pipeline_bots")]

SINGLE = {"title": "Fix", "task_type": "code", "message": "CI is red.", "executor": "codex"}
# Over the 16,000-char spill threshold; multibyte, so chars and bytes differ.
LOG = "".join(f"step {n:05d} compiled ✓\n" for n in range(3_000))


def create(api, body=SINGLE) -> dict:
    response = api.post("/api/tasks/", body, format="json")
    assert response.status_code == 201, response.json()
    return response.json()


def dispatch(worker_api) -> dict:
    response = worker_api.post(
        "/api/executor/dispatch/",
        {"kinds": ["codex"], "limit": 1, "worker_id": "w1"},
        format="json",
    )
    assert response.status_code == 200, response.json()
    [turn] = response.json()["turns"]
    return turn


def report(worker_api, turn, **body):
    body = {"worker_id": "w1", "attempt": turn["attempt"], "status": "COMPLETED", **body}
    return worker_api.post(
        f"/api/executor/subtasks/{turn['subtask_id']}/result/", body, format="json"
    )


def answered(api, worker_api, *, message: str = "CI is red.", **outcome) -> dict:
    """A task whose one assistant turn reported `outcome`; returns the dispatched turn."""
    create(api, {**SINGLE, "message": message})
    turn = dispatch(worker_api)
    response = report(worker_api, turn, **outcome)
    assert response.status_code == 200, response.json()
    return turn


def whole(response) -> bytes:
    assert isinstance(response, StreamingHttpResponse), response.content[:200]
    return b"".join(response.streaming_content)


def stored_file(storage_dir: Path, subtask_id: int) -> Path:
    artifact = Subtask.objects.select_related("artifact").get(pk=subtask_id).artifact
    assert artifact is not None
    return storage_dir / artifact.storage_key


def flip_a_byte(path: Path) -> None:
    damaged = bytearray(path.read_bytes())
    damaged[len(damaged) // 2] ^= 0x01
    path.write_bytes(bytes(damaged))


DAMAGES = {"flipped": flip_a_byte, "deleted": Path.unlink}


# --- previews in the views ------------------------------------------------------------------


def test_a_spilled_result_is_its_preview_sizes_and_links_in_both_views(api, worker_api):
    turn = answered(api, worker_api, result={"value": LOG, "exit_code": 0})
    artifact = Artifact.objects.get(subtasks__pk=turn["subtask_id"])
    detail = api.get(f"/api/tasks/{turn['task_id']}/")
    listed = api.get(f"/api/tasks/{turn['task_id']}/subtasks/")
    for response, shown in [
        (detail, detail.json()["turns"][1]),
        (listed, listed.json()["results"][1]),
    ]:
        assert response.status_code == 200
        assert len(response.content) < len(LOG) // 4  # never the whole value
        assert shown["spilled"] == "result.value"
        assert shown["result"]["exit_code"] == 0  # the other keys stay as sent
        value = shown["result"]["value"]
        url = f"http://testserver/api/tasks/{turn['task_id']}/subtasks/{turn['subtask_id']}/text/"
        assert value == {
            "preview": value["preview"],
            "truncated": True,
            "chars": len(LOG),
            "bytes": len(LOG.encode()),
            "lines": 3_000,
            "artifact": {
                "id": artifact.id,
                "sha256": hashlib.sha256(LOG.encode()).hexdigest(),
                "kind": artifact.kind,
                "download_url": f"http://testserver/api/artifacts/{artifact.id}/content/",
            },
            "url": url,
        }
        # The preview ingestion stored: head, marker, tail (2,000 chars each by default),
        # each cut on a line boundary so the marker stands on its own line.
        head = LOG[: LOG.rindex("\n", 0, 2_000) + 1]
        tail = LOG[LOG.index("\n", len(LOG) - 2_000) :]
        marker = truncation_marker(len(LOG) - len(head) - len(tail))
        assert value["preview"] == head + marker + tail


def test_the_turn_text_endpoint_streams_the_exact_whole_text(api, worker_api):
    turn = answered(api, worker_api, result={"value": LOG, "exit_code": 0})
    [_, shown] = api.get(f"/api/tasks/{turn['task_id']}/").json()["turns"]
    response = api.get(shown["result"]["value"]["url"])
    assert response.status_code == 200
    assert response["Content-Type"] == "text/plain; charset=utf-8"
    assert response["ETag"] == f'"{hashlib.sha256(LOG.encode()).hexdigest()}"'
    assert whole(response).decode() == LOG
    part = api.get(shown["result"]["value"]["url"], HTTP_RANGE="bytes=0-9")
    assert (part.status_code, whole(part)) == (206, LOG.encode()[:10])
    lines = api.get(shown["result"]["value"]["url"], {"lines": "2-3"})
    assert whole(lines).decode() == "".join(LOG.splitlines(keepends=True)[1:3])


def test_small_texts_stay_inline_and_have_no_text_endpoint(api, worker_api):
    turn = answered(api, worker_api, result={"value": "All green.", "exit_code": 0})
    user_turn, shown = api.get(f"/api/tasks/{turn['task_id']}/").json()["turns"]
    assert (user_turn["message"], user_turn["spilled"]) == ("CI is red.", None)
    assert (shown["result"], shown["error"], shown["spilled"]) == (
        {"value": "All green.", "exit_code": 0},
        "",
        None,
    )
    response = api.get(f"/api/tasks/{turn['task_id']}/subtasks/{turn['subtask_id']}/text/")
    assert response.status_code == 404
    assert response.json()["code"] == "not_found"
    # The turn named as Baton names turns, by its message id, not its subtask id.
    assert response.json()["detail"] == (
        f"Task {turn['task_id']} message 2's text did not spill: the turn shows it whole."
    )


def test_a_spilled_message_is_a_preview_everywhere_turns_are_answered(api, worker_api):
    message = "Please read this log:\n" + LOG
    created = create(api, {**SINGLE, "message": message})
    [shown, _] = created["turns"]
    assert shown["spilled"] == "message"
    assert shown["message"]["chars"] == len(message)
    assert whole(api.get(shown["message"]["url"])).decode() == message
    report(worker_api, dispatch(worker_api), result={"value": "Read it."})
    follow_up = api.post(
        f"/api/tasks/{created['id']}/messages/", {"message": message}, format="json"
    )
    assert follow_up.status_code == 201
    assert [turn["spilled"] for turn in follow_up.json()] == ["message", None]
    assert follow_up.json()[0]["message"]["preview"] == shown["message"]["preview"]


def test_a_spilled_error_and_a_spilled_json_value_are_previews(api, worker_api):
    failed = answered(api, worker_api, status="FAILED", error=LOG, error_code="executor_error")
    [_, shown] = api.get(f"/api/tasks/{failed['task_id']}/").json()["turns"]
    assert shown["spilled"] == "error"
    assert whole(api.get(shown["error"]["url"])).decode() == LOG

    rows = [{"step": n, "ok": True} for n in range(2_000)]
    done = answered(api, worker_api, result={"value": rows, "files_changed": ["a.py"]})
    [_, shown] = api.get(f"/api/tasks/{done['task_id']}/").json()["turns"]
    assert shown["spilled"] == "result"  # the whole result stays in the row, unread
    assert shown["result"]["truncated"] is True
    assert json.loads(whole(api.get(shown["result"]["url"]))) == rows
    # Unread indeed: a row whose stored result no longer parses is still shown.
    with connection.cursor() as cursor:
        cursor.execute(
            "UPDATE tasks_subtask SET result = %s WHERE id = %s",
            ['{"value": [', done["subtask_id"]],
        )
    [_, again] = api.get(f"/api/tasks/{done['task_id']}/").json()["turns"]
    assert again == shown


def test_the_text_endpoint_follows_the_task_views_access_rules(
    api, other_api, staff_api, worker_api
):
    turn = answered(api, worker_api, result={"value": LOG})
    url = f"/api/tasks/{turn['task_id']}/subtasks/{turn['subtask_id']}/text/"
    assert other_api.get(url).status_code == 404
    assert other_api.get(url).json()["code"] == "not_found"
    assert worker_api.get(url).status_code == 403  # workers read artifacts, not task views
    assert whole(staff_api.get(url)).decode() == LOG
    # A turn of another task, through this task's URL: not found either.
    other = answered(api, worker_api, result={"value": LOG + "more"})
    response = api.get(f"/api/tasks/{turn['task_id']}/subtasks/{other['subtask_id']}/text/")
    assert response.status_code == 404
    assert response.json()["detail"] == (
        f"Task {turn['task_id']} has no turn of subtask id {other['subtask_id']}."
    )


# --- pages bounded in bytes -----------------------------------------------------------------


def conversation_of(api, worker_api, rounds: int) -> int:
    task = create(api)
    for n in range(rounds):
        report(worker_api, dispatch(worker_api), result={"value": f"answer {n} " + "x" * 500})
        if n < rounds - 1:
            api.post(f"/api/tasks/{task['id']}/messages/", {"message": f"more {n}"}, format="json")
    return task["id"]


def test_a_page_of_turns_stops_before_the_byte_limit_and_next_continues(api, worker_api, settings):
    task_id = conversation_of(api, worker_api, rounds=5)  # 10 turns
    settings.BATON_API_PAGE_MAX_BYTES = 3_000
    url = f"/api/tasks/{task_id}/subtasks/?page_size=200"
    seen: list[int] = []
    pages = 0
    while url:
        response = api.get(url)
        assert response.status_code == 200, response.json()
        page = response.json()
        assert page["count"] == 10
        turns_json = json.dumps(page["results"], ensure_ascii=False, separators=(",", ":"))
        assert len(turns_json.encode()) <= 3_000
        seen += [turn["message_id"] for turn in page["results"]]
        url = page["next"]
        pages += 1
    assert seen == list(range(1, 11))  # each turn once, in order
    assert pages > 1


def test_a_turn_larger_than_the_byte_limit_still_gets_a_page_of_its_own(api, worker_api, settings):
    task_id = conversation_of(api, worker_api, rounds=1)
    settings.BATON_API_PAGE_MAX_BYTES = 10
    first = api.get(f"/api/tasks/{task_id}/subtasks/").json()
    assert [turn["message_id"] for turn in first["results"]] == [1]
    second = api.get(first["next"]).json()
    assert [turn["message_id"] for turn in second["results"]] == [2]
    assert second["next"] is None


def test_numbered_pages_keep_their_rules_and_after_cannot_join_them(api, worker_api):
    task_id = conversation_of(api, worker_api, rounds=2)  # 4 turns
    second = api.get(f"/api/tasks/{task_id}/subtasks/", {"page": 2, "page_size": 3}).json()
    assert [turn["message_id"] for turn in second["results"]] == [4]
    assert second["next"] is None
    assert second["previous"] == f"http://testserver/api/tasks/{task_id}/subtasks/?page_size=3"
    first = api.get(f"/api/tasks/{task_id}/subtasks/", {"page_size": 3}).json()
    next_url = urlsplit(first["next"])
    assert next_url.path == f"/api/tasks/{task_id}/subtasks/"
    assert parse_qs(next_url.query) == {"page_size": ["3"], "after": ["3"]}
    assert [turn["message_id"] for turn in api.get(first["next"]).json()["results"]] == [4]
    both = api.get(f"/api/tasks/{task_id}/subtasks/", {"page": 1, "after": 2})
    assert both.status_code == 400
    assert list(both.json()["fields"]) == ["after"]
    too_many = api.get(f"/api/tasks/{task_id}/subtasks/", {"page_size": 201})
    assert list(too_many.json()["fields"]) == ["page_size"]


# --- damaged artifacts ----------------------------------------------------------------------


@pytest.mark.parametrize("damage", DAMAGES)
def test_a_damaged_artifact_hides_no_turn(api, worker_api, artifact_storage_in_tmp, damage):
    task = create(api)
    first = dispatch(worker_api)
    report(worker_api, first, result={"value": LOG})
    api.post(f"/api/tasks/{task['id']}/messages/", {"message": "And now?"}, format="json")
    second = dispatch(worker_api)
    report(worker_api, second, result={"value": "Fixed it.\n" + LOG})
    DAMAGES[damage](stored_file(artifact_storage_in_tmp, first["subtask_id"]))

    detail = api.get(f"/api/tasks/{task['id']}/")
    listed = api.get(f"/api/tasks/{task['id']}/subtasks/")
    assert (detail.status_code, listed.status_code) == (200, 200)
    for turns in (detail.json()["turns"], listed.json()["results"]):
        assert [turn["message_id"] for turn in turns] == [1, 2, 3, 4]
        assert turns[2]["message"] == "And now?"
        assert turns[1]["result"]["value"]["chars"] == len(LOG)  # its preview, from the row
        assert turns[3]["result"]["value"]["preview"].startswith("Fixed it.\n")

    broken = api.get(turns[1]["result"]["value"]["url"])
    assert broken.status_code == 500
    assert broken["Content-Type"].startswith("application/json")
    assert broken.json()["code"] == "artifact_integrity"
    assert whole(api.get(turns[3]["result"]["value"]["url"])).decode() == "Fixed it.\n" + LOG


@pytest.mark.parametrize("damage", DAMAGES)
def test_a_repeated_report_after_damage_stays_idempotent_and_restores_the_text(
    api, worker_api, artifact_storage_in_tmp, damage
):
    result = {"value": LOG, "exit_code": 0}
    turn = answered(api, worker_api, result=result)
    path = stored_file(artifact_storage_in_tmp, turn["subtask_id"])
    DAMAGES[damage](path)

    repeat = report(worker_api, turn, result=result)
    assert repeat.status_code == 200, repeat.json()
    assert (repeat.json()["changed"], repeat.json()["status"]) == (False, "COMPLETED")
    assert path.read_bytes() == LOG.encode()  # the repeat brought the text: stored again
    url = f"/api/tasks/{turn['task_id']}/subtasks/{turn['subtask_id']}/text/"
    assert whole(api.get(url)).decode() == LOG


def test_a_different_report_after_damage_is_a_conflict_and_writes_nothing(
    api, worker_api, artifact_storage_in_tmp
):
    turn = answered(api, worker_api, result={"value": LOG})
    path = stored_file(artifact_storage_in_tmp, turn["subtask_id"])
    path.unlink()
    files_before = sorted(artifact_storage_in_tmp.rglob("*.txt"))

    different = report(worker_api, turn, result={"value": LOG + "changed"})
    assert different.status_code == 409
    assert different.json()["code"] == "conflict"
    assert sorted(artifact_storage_in_tmp.rglob("*.txt")) == files_before


@pytest.mark.parametrize(
    "outcome",
    [
        {"result": {"value": "Fixed."}},
        {"result": {"value": LOG}},
        {"status": "FAILED", "error": "ünïcode broke it"},
    ],
    ids=["inline", "spilled", "failed"],
)
def test_each_turns_history_measure_is_what_its_serializer_gives(api, worker_api, outcome):
    from backend.api.serializers import HistoryMeasureOutput
    from backend.tasks import selectors
    from backend.tasks.models import Task

    answered(api, worker_api, **outcome)
    task = Task.objects.get()
    shown = api.get(f"/api/tasks/{task.pk}/").json()["turns"]
    turns = list(selectors.task_turns(task=task))
    assert len(shown) == len(turns) == 2
    for view, turn in zip(shown, turns, strict=True):
        expected = json.loads(json.dumps(HistoryMeasureOutput(turn).data))
        assert view["history"] == expected
        assert list(view["history"]) == list(expected)
    assert (shown[1]["history"]["artifact"] is not None) == (
        outcome.get("result") == {"value": LOG}
    )
