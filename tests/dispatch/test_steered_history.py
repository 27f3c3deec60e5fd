"""A follow-up steered into a running turn, as later prompts show it: after the answer it was
given to, its label saying it was sent while that answer was being written."""

from __future__ import annotations

import pytest

from backend.dispatch.models import HistoryPolicy, PromptReport
from backend.dispatch.replay import replay_prompt
from tests.dispatch.steering import settle, steer
from tests.dispatch.test_dispatch_api import PIPELINE, create, dispatch, report

pytestmark = [pytest.mark.django_db, pytest.mark.usefixtures("pipeline_bots")]

GROUP_PIPELINE = {**PIPELINE, "is_group_chat": True, "sender": "alice"}


def _round(api, worker_api, task, *, steered: str | None = None) -> None:
    """Answer the task's pending round (coder, then reviewer); `steered` is given to the coder
    while it runs, and it receives it."""
    [coder] = dispatch(worker_api)
    if steered is not None:
        settle(worker_api, coder, steer(api, task, steered, sender="bob")["steer_id"])
    assert report(worker_api, coder, result={"value": "Retries added."}).status_code == 200
    [reviewer] = dispatch(worker_api, kinds=("claude_code",))
    assert report(worker_api, reviewer, result={"value": "Looks right."}).status_code == 200


def test_a_received_steer_is_shown_as_sent_while_its_answer_was_written(api, worker_api):
    task = create(api, GROUP_PIPELINE)
    _round(api, worker_api, task, steered="And log each retry.")
    api.post(
        f"/api/tasks/{task['id']}/messages/",
        {"message": "Ship it.", "sender": "alice"},
        format="json",
    )
    [coder] = dispatch(worker_api)
    assert coder["prompt"] == (
        "## Conversation History\n\n"
        "User[alice]:\nAdd retries.\n\n"
        "Assistant[coder]:\nRetries added.\n\n"
        "Assistant[reviewer]:\nLooks right.\n\n"
        "User[bob]: [sent while Assistant[coder] was answering]\nAnd log each retry.\n\n"
        "## Current Message\n\nUser[alice]:\nShip it.\n"
    )
    row = PromptReport.objects.get(subtask_id=coder["subtask_id"], kind="full")
    replay = replay_prompt(report=row)
    assert replay.matches and replay.text == coder["prompt"]


def test_a_steer_whose_answer_the_window_leaves_out_still_names_it(api, worker_api):
    task = create(api, GROUP_PIPELINE)
    _round(api, worker_api, task, steered="And log each retry.")
    # Only the newest history turn, the steer: its answer is dropped.
    HistoryPolicy.objects.filter(task_type="code").update(
        max_messages=1,
        keep_first_user_message=False,
        overrides=["max_messages", "keep_first_user_message"],
    )
    api.post(
        f"/api/tasks/{task['id']}/messages/",
        {"message": "Ship it.", "sender": "alice"},
        format="json",
    )
    [coder] = dispatch(worker_api)
    assert (
        "User[bob]: [sent while Assistant[coder] was answering]\nAnd log each retry.\n\n"
        "## Current Message"
    ) in coder["prompt"]
    assert "Assistant[coder]:\nRetries added." not in coder["prompt"]
