"""End to end: each turn of a resumed native session records that turn's usage and cost only.

Codex and Claude Code report a session's totals (Claude Code restores them on `--resume`); the
real worker must turn those into each turn's own numbers. Three turns, each one model request
of the stand-in's default usage, resume one session on one worker: every turn must read one
request's tokens through the task API, and the cost must not grow from turn to turn.
"""

from __future__ import annotations

import pytest

from executors.standin.script import DEFAULT_INPUT_TOKENS, DEFAULT_OUTPUT_TOKENS
from tests.e2e.live import worker

pytestmark = [
    pytest.mark.e2e,
    pytest.mark.django_db(transaction=True),
    pytest.mark.usefixtures("shipped_bots"),
]


@pytest.mark.parametrize("kind", ["codex", "claude_code"])
def test_three_resumed_turns_each_record_one_requests_usage(kind, baton, model_server, tmp_path):
    model_server.set_turns([{"text": f"Answer {number}."} for number in range(3)])
    with worker(baton, model_server, tmp_path, [kind]):
        task = baton.create(executor=kind, message="Question 0.")
        baton.wait(task["id"])
        for number in (1, 2):
            baton.follow_up(task["id"], f"Question {number}.")
            done = baton.wait(task["id"])
    turns = done["turns"][1::2]
    assert [turn["result"]["value"] for turn in turns] == ["Answer 0.", "Answer 1.", "Answer 2."]
    assert len({turn["native_session_id"] for turn in turns}) == 1  # one session, resumed twice
    assert len(model_server.model_requests()) == 3
    tokens = [(turn["usage"]["input_tokens"], turn["usage"]["output_tokens"]) for turn in turns]
    assert tokens == [(DEFAULT_INPUT_TOKENS, DEFAULT_OUTPUT_TOKENS)] * 3
    costs = [turn["usage"].get("cost_usd") for turn in turns]
    if kind == "claude_code":
        assert costs[0] is not None and costs[0] > 0  # Claude Code prices the request itself
    assert costs == [costs[0]] * 3
