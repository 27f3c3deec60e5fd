"""End to end: a resumed native session whose context overflows is retried in a fresh session.

The same live backend, real worker and real executors (Codex CLI, Claude Code) as
`test_native_sessions`. A first turn completes and leaves a session on the worker; the
follow-up resumes it with only the new message, and the model refuses every request of that
session as too long (the stand-in's context limit, with the API's real context-length error):
it is the session's own context that is full, not Baton's prompt of a few tokens — Claude Code's
own attempt to compact the session is refused too. The turn runs again in a fresh session with
Baton's full prompt under its normal budget, completes, and its prompt reports say so.
"""

from __future__ import annotations

import json

import pytest

from backend.dispatch.models import PromptReport
from backend.prompting.addressing import content_sha256
from backend.tasks.models import NativeSession
from executors.standin import extract_prompt
from tests.e2e.live import Baton, worker

pytestmark = [
    pytest.mark.e2e,
    pytest.mark.django_db(transaction=True),
    pytest.mark.usefixtures("shipped_bots"),
]

RESUMABLE = ["codex", "claude_code"]


def reports(subtask_id: int, attempt: int) -> dict[str, PromptReport]:
    rows = PromptReport.objects.filter(subtask_id=subtask_id, attempt=attempt)
    return {row.kind: row for row in rows}


def full_session_tokens(prompt: str) -> int:
    """What a request's prompt weighs in a session whose context is full: anything but Baton's
    full prompt — which carries the conversation itself, in a fresh session — is too much."""
    return 1 if prompt.startswith("## Conversation History\n\n") else 1_000_000


@pytest.mark.parametrize("kind", RESUMABLE)
def test_an_overflowed_resume_completes_in_a_fresh_session_with_the_full_prompt(
    kind, baton: Baton, model_server, tmp_path
):
    model_server.set_turns([{"text": "First answer."}, {"text": "Fresh answer."}])
    with worker(baton, model_server, tmp_path, [kind]):
        task = baton.create(executor=kind, message="First question.")
        first = baton.wait(task["id"])["turns"][1]
        # From now on the session's context is full: the model refuses its requests.
        model_server.set_context_limit(1_000, count_tokens=full_session_tokens)
        baton.follow_up(task["id"], "Second question.")
        done = baton.wait(task["id"])
    turn = done["turns"][3]
    assert (turn["status"], turn["attempts"], turn["result"]["value"]) == (
        "COMPLETED",
        2,
        "Fresh answer.",
    )
    assert (turn["error"], turn["error_code"]) == ("", "")
    assert turn["native_session_id"] not in ("", first["native_session_id"])

    calls = model_server.model_requests()
    refused = [call for call in calls if call.over_context_limit]
    # The resumed run: the session's memory, and only the new message from Baton.
    assert refused and extract_prompt(refused[0].api, refused[0].body) == "Second question."
    # The fresh run: no session behind it, Baton's full prompt with the whole conversation.
    fresh = calls[-1]
    assert not fresh.over_context_limit
    prompt = extract_prompt(fresh.api, fresh.body)
    assert prompt is not None
    assert prompt.startswith("## Conversation History\n\nUser:\nFirst question.\n")
    assert prompt.endswith("## Current Message\n\nUser:\nSecond question.\n")
    body = json.dumps(fresh.body, ensure_ascii=False)
    assert body.count("First answer.") == 1  # from Baton's history only

    overflowed, retried = reports(turn["id"], 1), reports(turn["id"], 2)
    assert {kind: row.sent for kind, row in overflowed.items()} == {"full": False, "resume": True}
    assert list(retried) == ["full"]  # no resume prompt offered on the retry
    row = retried["full"]
    assert (row.sent, row.resume_reason, row.retry_reason) == (
        True,
        "context_overflow",
        "resumed_session_overflow",
    )
    # The normal budget, not a halved one; the very bytes the model received.
    assert row.token_budget == overflowed["full"].token_budget
    assert row.effective_max_tokens == overflowed["full"].effective_max_tokens
    assert row.previous_token_budget is None
    assert row.prompt_sha256 == content_sha256(prompt)
    session = NativeSession.objects.get(task_id=task["id"])
    assert (session.session_id, session.turns) == (turn["native_session_id"], 1)
