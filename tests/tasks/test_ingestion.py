"""Ingestion: every recorded message and result is measured once and long text is spilled."""

from __future__ import annotations

import json

import pytest

from backend.artifacts.models import Artifact
from backend.artifacts.storage import ArtifactStorageError, artifact_storage, content_address
from backend.errors import InvalidInput, PayloadTooLarge
from backend.prompting import Role
from backend.prompting.addressing import count_lines
from backend.prompting.kinds import ArtifactKind, classify_text
from backend.prompting.units import count_tokens
from backend.tasks.fields import dump_lossless_json
from backend.tasks.ingestion import ingest_text, replace_unstorable_chars
from backend.tasks.models import Subtask, SubtaskStatus
from backend.tasks.selectors import turn_result
from backend.tasks.services import PipelineStep, append_message, create_task, record_result

pytestmark = pytest.mark.django_db


def new_task(user, message: str = "Please summarise the logs."):
    return create_task(
        owner=user,
        title="logs",
        task_type="code",
        message=message,
        pipeline=[PipelineStep(executor="codex")],
    )


def pending_turn(task) -> Subtask:
    return task.subtasks.get(role=Role.ASSISTANT, status=SubtaskStatus.PENDING)


def test_short_user_message_is_measured_and_kept_whole(user):
    task = new_task(user, message="héllo\nworld")
    turn = task.subtasks.get(role=Role.USER)
    assert turn.history_text == "héllo\nworld"
    assert (turn.history_chars, turn.history_bytes, turn.history_lines) == (11, 12, 2)
    assert turn.history_tokens == turn.history_text_tokens == count_tokens("héllo\nworld")
    assert turn.history_tokens_estimated is False
    assert turn.artifact is None
    assert turn.recorded_at is not None


def test_long_result_is_spilled_to_an_artifact_with_a_bounded_preview(user, settings):
    settings.BATON_SPILL_THRESHOLD_CHARS = 1_000
    settings.BATON_PREVIEW_HEAD_CHARS = 100
    settings.BATON_PREVIEW_TAIL_CHARS = 50
    task = new_task(user)
    log = "".join(f"step {i}: ok\n" for i in range(500))
    turn = record_result(
        subtask=pending_turn(task), status=SubtaskStatus.COMPLETED, result={"value": log}
    )
    turn.refresh_from_db()
    # The value lives in the artifact, not the row; the result reads back exactly as sent.
    assert turn.result == {"value": None}
    assert turn.result_value_in_artifact
    assert turn_result(subtask=turn) == {"value": log}
    # A log is cut on line boundaries: the head ends after the last line break within its
    # budget, the tail starts at the first one within its own, so the marker has its own line.
    head = log[: log.rindex("\n", 0, 100) + 1]
    tail = log[log.index("\n", len(log) - 50) :]
    assert (turn.preview_head, turn.preview_tail) == (head, tail)
    assert head.endswith("step 8: ok\n") and tail.startswith("\nstep 497: ok\n")
    removed = len(log) - len(head) - len(tail)
    assert turn.history_text == head + f"…{removed} chars truncated…" + tail
    assert turn.history_text_tokens == count_tokens(turn.history_text)
    assert (turn.history_chars, turn.history_bytes, turn.history_lines) == (
        len(log),
        len(log.encode()),
        500,
    )
    assert turn.history_tokens_estimated is True
    exact = count_tokens(log)
    assert abs(turn.history_tokens - exact) / exact < 0.15

    artifact = turn.artifact
    assert artifact.kind == ArtifactKind.TEXT
    assert (artifact.size_chars, artifact.size_bytes, artifact.size_lines) == (
        len(log),
        len(log.encode()),
        500,
    )
    with artifact_storage().open(artifact.storage_key, "rb") as stored:
        assert stored.read() == log.encode()
    assert artifact.id == artifact.sha256[:16]
    assert artifact.task_id == task.pk


def test_same_text_twice_is_one_artifact(user, settings):
    settings.BATON_SPILL_THRESHOLD_CHARS = 1_000
    settings.BATON_PREVIEW_HEAD_CHARS = settings.BATON_PREVIEW_TAIL_CHARS = 100
    text = "lorem ipsum " * 200
    task = new_task(user, message=text)
    record_result(
        subtask=pending_turn(task), status=SubtaskStatus.COMPLETED, result={"value": text}
    )
    append_message(task=task, message=text)
    turns = list(task.subtasks.exclude(status=SubtaskStatus.PENDING).order_by("message_id"))
    assert len(turns) == 3
    assert len({turn.artifact_id for turn in turns}) == 1
    assert len({turn.history_text for turn in turns}) == 1
    assert Artifact.objects.count() == 1


def test_result_without_value_is_canonical_json(user, settings):
    settings.BATON_SPILL_THRESHOLD_CHARS = 100
    settings.BATON_PREVIEW_HEAD_CHARS = settings.BATON_PREVIEW_TAIL_CHARS = 10
    task = new_task(user)
    result = {"files": ["b.py", "a.py"] * 20, "ok": True, "note": "日本"}
    turn = record_result(subtask=pending_turn(task), status=SubtaskStatus.COMPLETED, result=result)
    canonical = json.dumps(result, sort_keys=True, ensure_ascii=False, separators=(",", ":"))
    assert turn.history_chars == len(canonical)
    assert turn.preview_head == canonical[:10]
    assert turn.artifact.kind == ArtifactKind.JSON


@pytest.mark.parametrize(
    ("result", "history_text"),
    [
        ({"value": 42}, "42"),
        ({"value": 0.5, "unit": "s"}, "0.5"),
        ({"value": ["b", "a"]}, '["b","a"]'),
        ({"value": {"z": 1, "a": "日本"}}, '{"a":"日本","z":1}'),
        ({"value": True}, "true"),
        ({"value": None, "exit_code": 0}, '{"exit_code":0,"value":null}'),
        ({"value": ""}, ""),
    ],
)
def test_values_of_every_json_type_are_recorded_as_canonical_json(user, result, history_text):
    task = new_task(user)
    turn = record_result(subtask=pending_turn(task), status=SubtaskStatus.COMPLETED, result=result)
    assert turn.history_text == history_text
    assert turn.result == result  # kept exactly as sent
    assert turn.status == SubtaskStatus.COMPLETED


def test_failed_turn_records_its_error_as_history(user):
    task = new_task(user)
    turn = record_result(
        subtask=pending_turn(task), status=SubtaskStatus.FAILED, error="codex exited with 2"
    )
    assert turn.history_text == "codex exited with 2"
    assert turn.result is None


@pytest.mark.parametrize(
    ("result", "field"),
    [
        (["not", "an", "object"], "result"),
        ("text", "result"),
        (None, "result"),
    ],
)
def test_bad_results_are_refused_and_change_nothing(user, result, field):
    task = new_task(user)
    turn = pending_turn(task)
    with pytest.raises(InvalidInput) as error:
        record_result(subtask=turn, status=SubtaskStatus.COMPLETED, result=result)
    assert error.value.field == field
    turn.refresh_from_db()
    assert (turn.status, turn.result, turn.recorded_at) == (SubtaskStatus.PENDING, None, None)


def test_result_over_the_hard_limit_is_413(user, settings):
    settings.BATON_MAX_RESULT_BYTES = 10_000
    task = new_task(user)
    turn = pending_turn(task)
    with pytest.raises(PayloadTooLarge, match="10000 bytes"):
        record_result(subtask=turn, status=SubtaskStatus.COMPLETED, result={"value": "ü" * 5_001})
    turn.refresh_from_db()
    assert turn.status == SubtaskStatus.PENDING
    assert not Artifact.objects.exists()


def test_lone_surrogates_are_stored_losslessly_and_replaced_in_history(user):
    task = new_task(user)
    value = "cut emoji \ud83d here and NUL \x00 there"
    turn = record_result(
        subtask=pending_turn(task), status=SubtaskStatus.COMPLETED, result={"value": value}
    )
    stored = Subtask.objects.get(pk=turn.pk)
    assert stored.result == {"value": value}
    assert stored.history_text == "cut emoji \ufffd here and NUL \ufffd there"
    assert stored.history_replaced_chars == 2


def test_storage_failure_mid_write_leaves_the_turn_unrecorded_and_retry_works(
    user, settings, monkeypatch
):
    settings.BATON_SPILL_THRESHOLD_CHARS = 100
    settings.BATON_PREVIEW_HEAD_CHARS = settings.BATON_PREVIEW_TAIL_CHARS = 10
    task = new_task(user)
    turn = pending_turn(task)
    text = "0123456789" * 1_000
    storage = artifact_storage()
    original_save = type(storage)._save

    def failing_save(self, name, content):
        # Write half the bytes under the final name, then fail like a full disk would.
        path = self.path(name)
        import os

        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path, "wb") as partial:
            partial.write(content.read()[: len(text) // 2])
        raise OSError("No space left on device")

    monkeypatch.setattr(type(storage), "_save", failing_save)
    with pytest.raises(ArtifactStorageError, match="nothing was recorded"):
        record_result(subtask=turn, status=SubtaskStatus.COMPLETED, result={"value": text})
    turn.refresh_from_db()
    assert (turn.status, turn.recorded_at, turn.artifact_id) == (SubtaskStatus.PENDING, None, None)
    assert not Artifact.objects.exists()
    assert not storage.exists(content_address(text).storage_key)  # the half file is gone

    monkeypatch.setattr(type(storage), "_save", original_save)
    turn = record_result(subtask=turn, status=SubtaskStatus.COMPLETED, result={"value": text})
    with storage.open(turn.artifact.storage_key, "rb") as stored:
        assert stored.read() == text.encode()


@pytest.mark.parametrize(
    ("text", "kind"),
    [
        ('{"a": [1, 2, 3]}', ArtifactKind.JSON),
        ("[1, 2]\n", ArtifactKind.JSON),
        ("<!DOCTYPE html><html><body>hi</body></html>", ArtifactKind.WEB_OR_SEARCH),
        (
            "1. Django https://djangoproject.com\n2. DRF https://django-rest-framework.org\n"
            "3. tiktoken https://github.com/openai/tiktoken\n",
            ArtifactKind.WEB_OR_SEARCH,
        ),
        ("$ pytest -q\n....F\n1 failed, 4 passed\n", ArtifactKind.COMMAND_OUTPUT),
        (
            "Traceback (most recent call last):\n  File 'x.py'\nValueError\n",
            ArtifactKind.COMMAND_OUTPUT,
        ),
        ("\x1b[31mred\x1b[0m build", ArtifactKind.COMMAND_OUTPUT),
        ("make: *** [all] Error 2\nexit code 2\n", ArtifactKind.COMMAND_OUTPUT),
        (
            "diff --git a/x.py b/x.py\n--- a/x.py\n+++ b/x.py\n@@ -1 +1 @@\n",
            ArtifactKind.FILE_OR_CODE,
        ),
        ("import os\n\ndef main():\n    return os.getcwd()\n", ArtifactKind.FILE_OR_CODE),
        ("int main() {\n  return 0;\n}\n", ArtifactKind.FILE_OR_CODE),
        ("Dear team,\nthe release went well.\nThanks!\n", ArtifactKind.TEXT),
    ],
)
def test_classification_rules(text, kind):
    assert classify_text(text) == kind


def test_serialized_results_are_json_whatever_they_look_like():
    assert classify_text("plain words", serialized_json=True) == ArtifactKind.JSON


def test_lossless_json_round_trip():
    value = {"a": "\ud800x\udfff", "b": "\x00", "c": "日本語 😀"}
    text = dump_lossless_json(value)
    text.encode("utf-8")  # storable as UTF-8
    assert json.loads(text) == value
    assert "日本語" in text


@pytest.mark.parametrize(
    ("text", "lines"), [("", 0), ("a", 1), ("a\n", 1), ("a\nb", 2), ("\n\n", 2)]
)
def test_count_lines(text, lines):
    assert count_lines(text) == lines


def test_replace_unstorable_chars_counts():
    assert replace_unstorable_chars("a\ud800b\udc00\x00") == ("a\ufffdb\ufffd\ufffd", 3)
    assert replace_unstorable_chars("plain") == ("plain", 0)


def test_ingest_text_is_exact_below_the_threshold(user):
    task = new_task(user)
    ingested = ingest_text(text="short", task=task)
    assert ingested.artifact is None
    assert ingested.tokens == count_tokens("short")


def test_result_keys_and_order_survive_the_spill(user, settings):
    settings.BATON_SPILL_THRESHOLD_CHARS = 100
    settings.BATON_PREVIEW_HEAD_CHARS = settings.BATON_PREVIEW_TAIL_CHARS = 10
    task = new_task(user)
    result = {"thinking": "hm", "value": "v" * 500, "files": ["a.py"]}
    turn = record_result(subtask=pending_turn(task), status=SubtaskStatus.COMPLETED, result=result)
    stored = Subtask.objects.get(pk=turn.pk)
    assert list(turn_result(subtask=stored).items()) == list(result.items())


def test_spilled_value_with_replaced_characters_stays_in_the_row(user, settings):
    settings.BATON_SPILL_THRESHOLD_CHARS = 100
    settings.BATON_PREVIEW_HEAD_CHARS = settings.BATON_PREVIEW_TAIL_CHARS = 10
    task = new_task(user)
    value = "\ud800" + "v" * 500
    turn = record_result(
        subtask=pending_turn(task), status=SubtaskStatus.COMPLETED, result={"value": value}
    )
    stored = Subtask.objects.get(pk=turn.pk)
    assert not stored.result_value_in_artifact
    assert stored.result == {"value": value}
