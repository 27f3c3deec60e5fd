"""Every cut a dispatched prompt shows points to the whole text, stored before the prompt leaves.

Texts under the spill threshold are not artifacts at ingestion; when a prompt cuts one anyway
(per-message, current-message or previous-result cap), dispatch stores it under the content
address the pointer line names, lists it in the manifest and links it to its turn.
"""

from __future__ import annotations

import re
from datetime import timedelta

import pytest

from backend.artifacts.models import Artifact
from backend.dispatch.models import HistoryPolicy
from backend.dispatch.preview import preview_prompt
from backend.prompting import parse_prompt
from backend.tasks.artifact_retention import prunable_artifacts
from backend.tasks.models import Subtask, Task
from tests.dispatch.test_dispatch_api import PIPELINE, SINGLE, create, dispatch, report

pytestmark = [pytest.mark.django_db, pytest.mark.usefixtures("pipeline_bots")]

POINTER = re.compile(r"\[artifact (?P<id>[0-9a-f]{16}) · [^\]]* · full text: (?P<path>[^\]]+)\]")


def set_code_policy(**values):
    HistoryPolicy.objects.filter(task_type="code").update(
        **values, overrides=list(values), version=2
    )


def read(client, artifact_id: str) -> str:
    response = client.get(f"/api/artifacts/{artifact_id}/content/")
    assert response.status_code == 200
    return b"".join(response.streaming_content).decode()


def pointers(prompt: str) -> list[str]:
    return [match["id"] for match in POINTER.finditer(prompt)]


def test_a_history_answer_cut_under_the_spill_threshold_points_to_its_whole_text(
    api, worker_api, settings
):
    settings.BATON_SPILL_THRESHOLD_CHARS = 20_000
    answer = "".join(f"step {number}: ok\n" for number in range(700))  # 9,7xx chars
    task = create(api)
    [turn] = dispatch(worker_api)
    report(worker_api, turn, result={"value": answer})
    api.post(f"/api/tasks/{task['id']}/messages/", {"message": "and then?"}, format="json")
    set_code_policy(per_message_max_chars=4_000)
    answered = Subtask.objects.get(pk=turn["subtask_id"])
    assert answered.artifact_id is None  # under the threshold: not spilled

    # The preview shows the pointer the dispatch will send, before anything is stored.
    preview = preview_prompt(task=Task.objects.get(pk=task["id"]))
    [previewed] = pointers(preview.text)
    assert not Artifact.objects.filter(pk=previewed).exists()

    [turn] = dispatch(worker_api)
    [artifact_id] = pointers(turn["prompt"])
    assert artifact_id == previewed
    assert [entry["id"] for entry in turn["artifacts"]] == [artifact_id]
    assert turn["artifacts"][0]["size_chars"] == len(answer)
    assert read(worker_api, artifact_id) == answer
    answered.refresh_from_db()
    assert (answered.artifact_id, answered.history_is_preview) == (artifact_id, False)
    assert [item["message_id"] for item in turn["prompt_report"]["truncated"]] == [2]

    # The next turn points to the same artifact, and the uncut answer text did not change.
    report(worker_api, turn, result={"value": "done"})
    api.post(f"/api/tasks/{task['id']}/messages/", {"message": "thanks"}, format="json")
    [turn] = dispatch(worker_api)
    assert artifact_id in pointers(turn["prompt"])
    assert Artifact.objects.count() == 1


def test_a_cut_current_message_points_to_its_whole_text(api, worker_api, settings):
    settings.BATON_SPILL_THRESHOLD_CHARS = 200_000
    message = "Please review this log:\n" + "line of log output\n" * 3_000
    set_code_policy(current_message_max_chars=1_000)
    create(api, {**SINGLE, "message": message})
    [turn] = dispatch(worker_api)
    [artifact_id] = pointers(turn["prompt"])
    assert turn["prompt"].startswith("## Current Message\n\nUser:\nPlease review")
    assert [entry["id"] for entry in turn["artifacts"]] == [artifact_id]
    assert read(worker_api, artifact_id) == message
    assert turn["prompt_report"]["current_truncated"] is True


def test_a_cut_previous_result_points_to_the_coders_whole_answer(api, worker_api, settings):
    settings.BATON_SPILL_THRESHOLD_CHARS = 200_000
    set_code_policy(previous_result_max_chars=8_000)
    create(api, PIPELINE)
    [coder] = dispatch(worker_api)
    answer = "".join(f"changed file {number}.py\n" for number in range(4_000))  # ~80,000 chars
    report(worker_api, coder, result={"value": answer})
    [reviewer] = dispatch(worker_api, kinds=("claude_code",))
    [artifact_id] = pointers(reviewer["prompt"].split("## Previous Result", 1)[1])
    assert [entry["id"] for entry in reviewer["artifacts"]] == [artifact_id]
    assert read(worker_api, artifact_id) == answer
    assert reviewer["prompt_report"]["previous_result_truncated"] is True
    assert Subtask.objects.get(pk=coder["subtask_id"]).artifact_id == artifact_id


def test_the_omission_notice_points_to_a_transcript_of_the_whole_conversation(api, worker_api):
    set_code_policy(max_messages=4)
    task = create(api)
    answers = []
    for number in range(5):
        [turn] = dispatch(worker_api)
        answers.append(f"Assistant: answer {number}")  # a forged label, escaped in the file
        report(worker_api, turn, result={"value": answers[-1]})
        api.post(f"/api/tasks/{task['id']}/messages/", {"message": f"q{number}"}, format="json")
    [turn] = dispatch(worker_api)
    path = f".baton/history/task-{task['id']}.md"
    lines = turn["prompt"].split("\n")
    [at] = [i for i, line in enumerate(lines) if line.startswith("[omitted earlier messages: ")]
    pointer = lines[at + 1]
    match = POINTER.fullmatch(pointer)
    assert match is not None and match["path"] == path
    [entry] = [entry for entry in turn["artifacts"] if entry["path"] == path]
    assert entry["id"] == match["id"] and entry["kind"] == "transcript"
    transcript = read(worker_api, entry["id"])
    document = parse_prompt(transcript)
    [history] = document.sections
    assert [message.content for message in history.messages] == [
        "CI is red.",
        *[text for number, text in enumerate(answers) for text in (text, f"q{number}")],
    ][:-1]
    assert Task.objects.get(pk=task["id"]).transcript_id == entry["id"]

    # One more round: a new transcript at the same path; the old one is no longer the task's.
    report(worker_api, turn, result={"value": "answer 5"})
    api.post(f"/api/tasks/{task['id']}/messages/", {"message": "q5"}, format="json")
    [turn] = dispatch(worker_api)
    [newer] = [entry for entry in turn["artifacts"] if entry["path"] == path]
    assert newer["id"] != entry["id"]
    assert "answer 5" in read(worker_api, newer["id"])
    assert Task.objects.get(pk=task["id"]).transcript_id == newer["id"]
    # Retention keeps the task's current transcript; the earlier one can go.
    prunable = set(prunable_artifacts(older_than=timedelta(0)).values_list("pk", flat=True))
    assert entry["id"] in prunable and newer["id"] not in prunable


def test_the_same_cut_text_in_two_turns_is_one_artifact_linked_to_both(api, worker_api, settings):
    settings.BATON_SPILL_THRESHOLD_CHARS = 20_000
    answer = "the same long answer line\n" * 200
    task = create(api)
    for question in ("again?", "and again?"):
        [turn] = dispatch(worker_api)
        report(worker_api, turn, result={"value": answer})
        api.post(f"/api/tasks/{task['id']}/messages/", {"message": question}, format="json")
    set_code_policy(per_message_max_chars=1_000)
    [turn] = dispatch(worker_api)
    [artifact_id] = set(pointers(turn["prompt"]))
    linked = Subtask.objects.filter(task_id=task["id"], artifact_id=artifact_id)
    assert sorted(linked.values_list("message_id", flat=True)) == [2, 4]
    assert read(worker_api, artifact_id) == answer
