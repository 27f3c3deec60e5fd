"""End to end: the worker resumes Codex and Claude Code sessions with only the unseen turns.

The same live backend, real worker and real executors as `test_executors`; what is checked here
is what the model receives on later turns: every earlier turn exactly once, whether it came
from the session's own memory or from Baton's resume prompt.
"""

from __future__ import annotations

import json
import shutil
import time

import pytest

from backend.dispatch.models import PromptReport
from backend.tasks.models import NativeSession
from tests.conftest import register_bot
from tests.e2e.live import Baton, worker

pytestmark = [
    pytest.mark.e2e,
    pytest.mark.django_db(transaction=True),
    pytest.mark.usefixtures("shipped_bots"),
]

RESUMABLE = ["codex", "claude_code"]
# Where each executor keeps its sessions in the task's executor home.
SESSION_DIRS = {"codex": "sessions", "claude_code": "projects"}


def request_text(request) -> str:
    return json.dumps(request.body, ensure_ascii=False)


def sent_prompts(subtask_id: int) -> list[tuple[str, bool | None]]:
    return sorted(PromptReport.objects.filter(subtask_id=subtask_id).values_list("kind", "sent"))


@pytest.mark.parametrize("kind", RESUMABLE)
def test_four_turns_on_one_worker_send_each_earlier_turn_once(
    kind, baton: Baton, model_server, tmp_path
):
    questions = [f"Question {n}: what about module m{n}?" for n in range(4)]
    answers = [f"Answer {n}: module m{n} is fine." for n in range(4)]
    model_server.set_turns([{"text": text} for text in answers])
    with worker(baton, model_server, tmp_path, [kind]):
        task = baton.create(executor=kind, message=questions[0])
        baton.wait(task["id"])
        for question in questions[1:]:
            baton.follow_up(task["id"], question)
            done = baton.wait(task["id"])
    assistant_turns = done["turns"][1::2]
    assert [turn["result"]["value"] for turn in assistant_turns] == answers
    # One session all along.
    assert len({turn["native_session_id"] for turn in assistant_turns}) == 1
    requests = model_server.model_requests()
    assert len(requests) == 4
    for number in range(1, 4):
        body = request_text(requests[number])
        for earlier in questions[:number] + answers[:number]:
            assert body.count(earlier) == 1, (number, earlier)
        assert body.count(questions[number]) == 1
    for turn in assistant_turns[1:]:
        assert sent_prompts(turn["id"]) == [("full", False), ("resume", True)]
    session = NativeSession.objects.get(task_id=task["id"])
    assert (session.turns, session.seen_through_message_id) == (4, 8)


def test_a_group_chat_with_two_bots_sends_each_new_turn_once(baton: Baton, model_server, tmp_path):
    register_bot("coder", "codex", model="gpt-5.5")
    register_bot("reviewer", "claude_code", model="claude-sonnet-4-5")
    texts = [
        "Coder round one: retries added.",
        "Reviewer round one: add a test.",
        "Coder round two: test added.",
        "Reviewer round two: approved.",
    ]
    model_server.set_turns([{"text": text} for text in texts])
    with worker(baton, model_server, tmp_path, ["codex", "claude_code"]):
        task = baton.create(
            message="Alice: please add retries to the uploader.",
            sender="alice",
            is_group_chat=True,
            pipeline=[{"bot": "coder"}, {"bot": "reviewer"}],
        )
        _wait_for_round(baton, task["id"], assistant_turns=2)
        response = baton.product.post(
            f"/api/tasks/{task['id']}/messages/",
            json={"message": "Bob: yes, and cover the timeout path.", "sender": "bob"},
        )
        assert response.status_code == 201, response.text
        done = _wait_for_round(baton, task["id"], assistant_turns=4)
    assert [turn["result"]["value"] for turn in done["turns"] if turn["role"] == "ASSISTANT"] == (
        texts
    )
    coder_two, reviewer_two = model_server.model_requests()[2:]
    coder_body, reviewer_body = request_text(coder_two), request_text(reviewer_two)
    # The coder's session learns the reviewer's answer and Bob's message, once each.
    for text in ("Alice: please add retries", texts[0], texts[1], "Bob: yes, and cover"):
        assert coder_body.count(text) == 1, text
    # The reviewer's session learns Bob's message and the coder's new answer, once each.
    for text in ("Alice: please add retries", texts[0], texts[1], "Bob: yes, and cover", texts[2]):
        assert reviewer_body.count(text) == 1, text


def _wait_for_round(baton: Baton, task_id: int, *, assistant_turns: int) -> dict:
    deadline = time.monotonic() + 90
    while True:
        task = baton.wait(task_id)
        answered = [t for t in task["turns"] if t["role"] == "ASSISTANT" and t["result"]]
        if len(answered) >= assistant_turns:
            return task
        assert time.monotonic() < deadline, task
        time.sleep(0.1)


def test_another_worker_waits_the_grace_period_then_runs_fresh(
    baton: Baton, model_server, tmp_path, settings
):
    settings.BATON_SESSION_AFFINITY_SECONDS = 2
    model_server.set_turns([{"text": "First answer."}, {"text": "Second answer."}])
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    with worker(baton, model_server, tmp_path / "a", ["codex"], BATON_WORKER_ID="worker-a"):
        task = baton.create(executor="codex", message="First question.")
        first = baton.wait(task["id"])["turns"][1]
    with worker(baton, model_server, tmp_path / "b", ["codex"], BATON_WORKER_ID="worker-b"):
        asked = time.monotonic()
        baton.follow_up(task["id"], "Second question.")
        done = baton.wait(task["id"])
        waited = time.monotonic() - asked
    second = done["turns"][3]
    assert (second["status"], second["result"]["value"]) == ("COMPLETED", "Second answer.")
    assert waited >= 2  # worker-a had its turn first
    assert second["native_session_id"] != first["native_session_id"]  # a fresh session
    assert sent_prompts(second["id"]) == [("full", True)]
    prompt = model_server.model_requests()[1]
    assert request_text(prompt).count("First answer.") == 1  # from Baton's history, once
    assert PromptReport.objects.get(subtask_id=second["id"]).resume_reason == "other_worker"
    session = NativeSession.objects.get(task_id=task["id"])
    assert (session.worker_id, session.session_id) == ("worker-b", second["native_session_id"])


@pytest.mark.parametrize("kind", RESUMABLE)
def test_a_lost_session_falls_back_to_a_fresh_run_within_the_claim(
    kind, baton: Baton, model_server, tmp_path
):
    model_server.set_turns([{"text": "First answer."}, {"text": "Second answer."}])
    with worker(baton, model_server, tmp_path, [kind]) as running:
        task = baton.create(executor=kind, message="First question.")
        first = baton.wait(task["id"])["turns"][1]
        # The session's files are gone (a wiped disk, a reinstalled worker).
        home = running.workspace_root / ".worker" / "homes" / str(task["id"]) / kind
        shutil.rmtree(home / SESSION_DIRS[kind])
        baton.follow_up(task["id"], "Second question.")
        done = baton.wait(task["id"])
        assert '"event": "turn_resume_failed"' in running.logs()
    second = done["turns"][3]
    assert (second["status"], second["attempts"]) == ("COMPLETED", 1)  # the same claim
    assert second["result"]["value"] == "Second answer."
    assert second["native_session_id"] not in ("", first["native_session_id"])
    assert sent_prompts(second["id"]) == [("full", True), ("resume", False)]
    # The fresh run got the whole conversation from Baton.
    last = request_text(model_server.model_requests()[-1])
    assert last.count("First question.") == 1 and last.count("First answer.") == 1
    session = NativeSession.objects.get(task_id=task["id"])
    assert session.session_id == second["native_session_id"]
