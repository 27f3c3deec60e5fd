"""A long log keeps its traceback in every prompt a worker receives, whatever section cut it.

Sent through the API the way a product sends it — a first message, a follow-up, a pipeline
step's answer, a follow-up a native session resumes with — an INFO-heavy log with a traceback in
its middle reaches the agent with the traceback, the exception and the error line, and a pointer
to the whole text.
"""

from __future__ import annotations

import pytest

from tests.dispatch.test_dispatch_api import PIPELINE, SINGLE, create, dispatch, report
from tests.dispatch.test_sessions import answer, follow_up
from tests.prompting.test_cuts import BIG_LOG, EVIDENCE, MEDIUM_LOG

pytestmark = [pytest.mark.django_db, pytest.mark.usefixtures("pipeline_bots")]


def assert_keeps_the_traceback(prompt: str) -> None:
    lines = prompt.splitlines()
    for line in EVIDENCE:
        assert line in lines, line
    assert any(line.startswith("[artifact ") for line in lines)


def test_a_long_first_message_reaches_the_agent_with_its_traceback(api, worker_api):
    create(api, {**SINGLE, "message": BIG_LOG})
    [turn] = dispatch(worker_api)
    assert_keeps_the_traceback(turn["prompt"])
    assert len(turn["prompt"]) < 33_000


def test_a_long_follow_up_and_its_resume_prompt_keep_the_traceback(api, worker_api):
    task = create(api)
    [turn] = dispatch(worker_api)
    answer(worker_api, turn, "Send me the worker's log.")
    follow_up(api, task, BIG_LOG)
    [turn] = dispatch(worker_api)
    assert turn["resume_prompt"] is not None  # the worker holds the session
    assert_keeps_the_traceback(turn["prompt"])
    assert_keeps_the_traceback(turn["resume_prompt"])


def test_a_pipeline_steps_long_answer_keeps_its_traceback_as_the_previous_result(api, worker_api):
    create(api, PIPELINE)
    [coder] = dispatch(worker_api)
    assert report(worker_api, coder, result={"value": MEDIUM_LOG}).status_code == 200
    [reviewer] = dispatch(worker_api, kinds=("claude_code",))
    assert "## Previous Result" in reviewer["prompt"]
    assert_keeps_the_traceback(reviewer["prompt"])
