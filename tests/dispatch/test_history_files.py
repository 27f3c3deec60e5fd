"""History files through the API: when a prompt leaves turns out, the workspace gets every
earlier turn's whole text as a file of its own and an index of them, named by the notice.

Checked as an executor uses them: the manifest lists each file at its path, a download gives
the turn's whole text (a spilled one whole, a failed one's error), unchanged files are the same
artifacts on the next dispatch, and nobody but the task's owner and the worker holding its turn
can read them.
"""

from __future__ import annotations

import json
from datetime import timedelta

import pytest
from django.core.serializers.json import DjangoJSONEncoder
from rest_framework.request import Request
from rest_framework.test import APIRequestFactory

from backend.api import executor_views
from backend.api.executor_serializers import DispatchOutput
from backend.artifacts.models import Artifact
from backend.dispatch import prompts
from backend.prompting import history_files_note
from backend.prompting.addressing import count_lines
from backend.tasks.artifact_retention import prunable_artifacts
from backend.tasks.models import Subtask, Task
from tests.dispatch.test_dispatch_api import SINGLE, create, dispatch, report
from tests.dispatch.test_whole_texts import set_code_policy

pytestmark = [pytest.mark.django_db, pytest.mark.usefixtures("pipeline_bots")]

INDEX = ".baton/history/turns/index.tsv"
LONG_ANSWER = "".join(f"collected line {number}\n" for number in range(1_500))  # spills


def download(client, entry: dict) -> tuple[int, str]:
    response = client.get(entry["download_url"])
    body = b"".join(response.streaming_content) if response.status_code == 200 else b""
    return response.status_code, body.decode()


def turn_files(turn: dict) -> dict[str, dict]:
    """The manifest's turn files by path (the index left out)."""
    return {
        entry["path"]: entry
        for entry in turn["artifacts"]
        if entry["path"].startswith(".baton/history/turns/") and entry["path"] != INDEX
    }


def index_entry(turn: dict) -> dict:
    [entry] = [entry for entry in turn["artifacts"] if entry["path"] == INDEX]
    return entry


def converse(api, worker_api, task: dict, outcomes: list[dict]) -> dict:
    """Answer the pending turn with each outcome in turn, asking "q<n>" after each; return the
    next dispatched turn."""
    for number, outcome in enumerate(outcomes):
        [turn] = dispatch(worker_api)
        assert report(worker_api, turn, **outcome).status_code == 200
        response = api.post(
            f"/api/tasks/{task['id']}/messages/", {"message": f"q{number}"}, format="json"
        )
        assert response.status_code == 201, response.json()
    [turn] = dispatch(worker_api)
    return turn


def test_a_prompt_that_leaves_turns_out_lists_each_earlier_turn_as_a_file(api, worker_api):
    set_code_policy(max_messages=2)
    task = create(api)
    turn = converse(
        api,
        worker_api,
        task,
        [
            {"result": {"value": "Looked: the upload test races.\nDetails below."}},
            {"result": {"value": LONG_ANSWER}},
            {"status": "FAILED", "error": "Timed out."},
        ],
    )
    assert turn["message_id"] == 8 and turn["prompt_report"]["messages_omitted"] > 0
    assert f"\n{history_files_note()}\n\n" in turn["prompt"]

    whole = {
        1: SINGLE["message"],
        2: "Looked: the upload test races.\nDetails below.",
        3: "q0",
        4: LONG_ANSWER,
        5: "q1",
        6: "Timed out.",
    }
    files = turn_files(turn)
    assert list(files) == [f".baton/history/turns/{number}.md" for number in whole]
    for number, text in whole.items():
        entry = files[f".baton/history/turns/{number}.md"]
        assert download(worker_api, entry) == (200, text)
        assert (entry["size_chars"], entry["size_lines"]) == (len(text), count_lines(text))
    # A spilled answer's file is its artifact, the one its pointer line names: not a copy.
    spilled = Subtask.objects.get(task_id=task["id"], message_id=4)
    assert spilled.history_is_preview and files[".baton/history/turns/4.md"]["id"] == (
        spilled.artifact_id
    )

    entry = index_entry(turn)
    assert download(worker_api, entry) == (
        200,
        "message_id\trole\tname\tstatus\tchars\tlines\tfile\tfirst_line\n"
        "1\tUSER\t-\tCOMPLETED\t10\t1\t.baton/history/turns/1.md\tCI is red.\n"
        "2\tASSISTANT\tcodex\tCOMPLETED\t45\t2\t.baton/history/turns/2.md\t"
        "Looked: the upload test races.\n"
        "3\tUSER\t-\tCOMPLETED\t2\t1\t.baton/history/turns/3.md\tq0\n"
        f"4\tASSISTANT\tcodex\tCOMPLETED\t{len(LONG_ANSWER)}\t1500\t"
        ".baton/history/turns/4.md\tcollected line 0\n"
        "5\tUSER\t-\tCOMPLETED\t2\t1\t.baton/history/turns/5.md\tq1\n"
        "6\tASSISTANT\tcodex\tFAILED\t10\t1\t.baton/history/turns/6.md\tTimed out.\n",
    )
    assert Task.objects.get(pk=task["id"]).turn_index_id == entry["id"]


def test_unchanged_turn_files_are_the_same_artifacts_on_the_next_dispatch(api, worker_api):
    set_code_policy(max_messages=2)
    task = create(api)
    first = converse(api, worker_api, task, [{"result": {"value": f"a{n}"}} for n in range(3)])
    before = {path: entry["id"] for path, entry in turn_files(first).items()}
    artifacts = Artifact.objects.count()

    report(worker_api, first, result={"value": "a3"})
    api.post(f"/api/tasks/{task['id']}/messages/", {"message": "q3"}, format="json")
    [second] = dispatch(worker_api)
    after = {path: entry["id"] for path, entry in turn_files(second).items()}
    assert {path: after[path] for path in before} == before
    assert sorted(set(after) - set(before)) == [
        ".baton/history/turns/7.md",
        ".baton/history/turns/8.md",
    ]
    # Two turn files, a transcript and an index are new; nothing else was written.
    assert Artifact.objects.count() == artifacts + 4
    assert index_entry(second)["id"] != index_entry(first)["id"]
    # Retention keeps the turn files (their turns reference them) and the current index only.
    prunable = set(prunable_artifacts(older_than=timedelta(0)).values_list("pk", flat=True))
    assert index_entry(first)["id"] in prunable
    assert prunable.isdisjoint({index_entry(second)["id"], *after.values()})


@pytest.mark.parametrize(
    ("caps", "builds"),
    [
        # The window holds the newest two turns: older ones are only counted, so the omission
        # is certain before building, and the transcript is read first.
        ({"max_messages": 2}, 1),
        # Every turn is loaded, and only the character budget leaves some out: that shows
        # once built, and the prompt is built again with its pointer.
        ({"max_messages": None, "max_chars": 300, "per_message_max_chars": 100}, 2),
    ],
)
def test_a_prompt_is_built_again_only_when_its_omission_showed_once_built(
    api, worker_api, monkeypatch, caps, builds
):
    set_code_policy(**caps)
    task = create(api)
    turn = converse(
        api, worker_api, task, [{"result": {"value": f"answer {n} " * 20}} for n in range(3)]
    )
    report(worker_api, turn, result={"value": "the last answer"})
    api.post(f"/api/tasks/{task['id']}/messages/", {"message": "q3"}, format="json")
    inputs = []
    real_build = prompts.build_prompt

    def counting(prompt_input, *args, **kwargs):
        inputs.append(prompt_input)
        return real_build(prompt_input, *args, **kwargs)

    monkeypatch.setattr(prompts, "build_prompt", counting)
    [turn] = dispatch(worker_api)

    assert [prompt_input.transcript is not None for prompt_input in inputs] == [
        *([False] * (builds - 1)),
        True,
    ]
    assert turn["prompt_report"]["messages_omitted"] > 0
    assert inputs[-1].transcript.artifact_id == Task.objects.get(pk=task["id"]).transcript_id
    notice = turn["prompt"].split("\n\n")[1]
    assert f".baton/history/task-{task['id']}.md" in notice, notice


def test_only_the_owner_and_the_worker_holding_the_turn_read_the_history_files(
    api, worker_api, other_worker_api, other_api
):
    set_code_policy(max_messages=2)
    task = create(api)
    answer = "an answer only this task has"
    turn = converse(api, worker_api, task, [{"result": {"value": answer}}] * 2)
    entries = [index_entry(turn), turn_files(turn)[".baton/history/turns/2.md"]]
    for entry in entries:
        assert download(worker_api, entry)[0] == 200
        assert download(api, entry)[0] == 200
        assert download(other_worker_api, entry)[0] == 404
        assert download(other_api, entry)[0] == 404
    # Once its claim ends, the worker reads them no more.
    report(worker_api, turn, result={"value": "done"})
    for entry in entries:
        assert download(worker_api, entry)[0] == 404


def test_the_dispatch_answer_is_what_its_serializer_describes(api, worker_api, monkeypatch):
    """The answer is built as plain data (a manifest lists a file per earlier turn): it is
    exactly what `DispatchOutput` makes of the same turn, download URLs and dates included."""
    set_code_policy(max_messages=2)
    task = create(api)
    built = []
    plain_payload = executor_views._turn_payload

    def keeping(turn, **kwargs):
        payload = plain_payload(turn, **kwargs)
        built.append((turn, payload))
        return payload

    monkeypatch.setattr(executor_views, "_turn_payload", keeping)
    answered = converse(
        api,
        worker_api,
        task,
        [{"result": {"value": "Looked."}}, {"result": {"value": LONG_ANSWER}}],
    )
    claimed, payload = built[-1]
    assert len(answered["artifacts"]) >= 5  # spilled answer, transcript, index, turn files
    described = {
        **payload,
        "artifacts": claimed.manifest,
        "lease_expires_at": claimed.subtask.lease_expires_at,
    }
    request = Request(APIRequestFactory().post("/api/executor/dispatch/"))
    serialized = DispatchOutput(
        {"turns": [described], "next_ready_in_seconds": None}, context={"request": request}
    ).data
    assert json.loads(json.dumps(serialized, cls=DjangoJSONEncoder)) == {
        "turns": [answered],
        "next_ready_in_seconds": None,
    }
