"""End to end: a provider's own words for an over-long prompt requeue the turn smaller.

The real worker runs the real executor against the stand-in model, which answers the turn's
first attempt with Moonshot/Kimi's HTTP 400 body — no OpenAI error code, only the words. Baton
must know it for a context overflow and requeue the turn with a smaller prompt, which the model
then answers, instead of failing it as an executor error. Claude Code is not here: 2.1.332 knows
Kimi's words itself and reports `terminal_reason: prompt_too_long`
(tests/executors/test_provider_overflow_words.py covers its path with every provider's body).
"""

from __future__ import annotations

import pytest

from backend.dispatch.models import PromptReport
from tests.e2e.live import worker
from tests.e2e.test_executors import BUILD_LOG

pytestmark = [
    pytest.mark.e2e,
    pytest.mark.django_db(transaction=True),
    pytest.mark.usefixtures("shipped_bots"),
]

# Moonshot's body for a prompt over Kimi's window (MoonshotAI/kimi-cli#2011).
KIMI_OVERFLOW = (
    "Invalid request: Your request exceeded model token limit: 262144 (requested: 336979)"
)


@pytest.mark.parametrize("kind", ["codex", "agno"])
def test_kimis_words_for_an_over_long_prompt_requeue_the_turn_smaller(
    kind, baton, model_server, tmp_path
):
    model_server.set_turns(
        [
            {"text": "Looked."},
            {"http_status": 400, "message": KIMI_OVERFLOW},
            {"text": "Done on the retry."},
        ]
    )
    with worker(baton, model_server, tmp_path, [kind]):
        task = baton.create(executor=kind, message="Look at the build.")
        baton.wait(task["id"])
        baton.follow_up(task["id"], BUILD_LOG)
        done = baton.wait(task["id"])
    turn = done["turns"][3]
    assert (turn["status"], turn["attempts"], turn["result"]["value"]) == (
        "COMPLETED",
        2,
        "Done on the retry.",
    ), turn
    assert (turn["error"], turn["error_code"]) == ("", "")
    retried = PromptReport.objects.get(subtask_id=turn["id"], attempt=2, kind="full")
    if kind == "codex":
        # The overflow came from a resumed session: the retry starts a fresh one, with the
        # prompt Baton renders to fit (test_executors shows the same for OpenAI's words).
        assert retried.retry_reason == "resumed_session_overflow"
        assert turn["native_session_id"] != done["turns"][1]["native_session_id"]
    else:
        overflowed = PromptReport.objects.get(subtask_id=turn["id"], attempt=1, kind="full")
        assert (retried.retry_reason, retried.token_budget) == (
            "context_overflow",
            overflowed.tokens // 2,
        )
