"""End to end: follow-ups a user sends while the agent is still working, through the real HTTP
stack, the real worker and the real executors, against the model server on loopback.

`enqueue`: the messages wait and are answered one after the other, each seeing the answers
before it. `interrupt`: the running executor is stopped mid tool call (no process left
behind), and the model reads what the interrupted turn had written before the new message.
"""

from __future__ import annotations

import time

import pytest

from backend.dispatch.policies import set_policy
from tests.e2e.live import prompts, worker
from tests.e2e.test_executors import KINDS, _alive, tool_call

pytestmark = [
    pytest.mark.e2e,
    pytest.mark.django_db(transaction=True),
    pytest.mark.usefixtures("shipped_bots"),
]


def send(baton, task_id: int, message: str, **body) -> dict:
    response = baton.product.post(
        f"/api/tasks/{task_id}/messages/", json={"message": message, **body}
    )
    assert response.status_code in (201, 202), response.text
    return response.json()


def wait_for(condition, running, *, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, running.logs()[-3000:]
        time.sleep(0.05)


def test_three_follow_ups_sent_while_a_turn_runs_are_answered_in_order(
    baton, model_server, tmp_path
):
    kind = "codex"
    # Baton's full prompt every turn (resuming native sessions is test_native_sessions').
    set_policy(task_type="code", values={"resume_native_sessions": False})
    # The first turn runs a command that waits until the test lets it finish.
    model_server.set_turns(
        [
            tool_call(kind, "while [ ! -f go ]; do sleep 0.05; done; echo built"),
            {"text": "Build is green."},
            {"text": "Answer two."},
            {"text": "Answer three."},
            {"text": "Answer four."},
        ]
    )
    with worker(baton, model_server, tmp_path, [kind]) as running:
        task = baton.create(executor=kind, message="Run the build.")
        wait_for(lambda: baton.task(task["id"])["turns"][1]["status"] == "RUNNING", running)
        queued = [send(baton, task["id"], f"Follow-up {n}.") for n in (2, 3, 4)]
        assert [q["status"] for q in queued] == ["queued"] * 3
        shown = baton.task(task["id"])
        assert [q["message"] for q in shown["queued_messages"]] == [
            "Follow-up 2.",
            "Follow-up 3.",
            "Follow-up 4.",
        ]
        (running.workspace_root / str(task["id"]) / "go").touch()
        done = baton.wait(task["id"])
    assert [(t["role"], t["status"]) for t in done["turns"]] == [
        ("USER", "COMPLETED"),
        ("ASSISTANT", "COMPLETED"),
    ] * 4
    assert [t["message"] for t in done["turns"][2::2]] == [
        "Follow-up 2.",
        "Follow-up 3.",
        "Follow-up 4.",
    ]
    assert [t["result"]["value"] for t in done["turns"][1::2]] == [
        "Build is green.",
        "Answer two.",
        "Answer three.",
        "Answer four.",
    ]
    # What the model received: each queued message as the current message, after the answers
    # to everything before it (the prompts after the first turn's two model requests).
    later = prompts(model_server)[2:]
    assert len(later) == 3
    for prompt, (message, previous_answer) in zip(
        later,
        [
            ("Follow-up 2.", "Build is green."),
            ("Follow-up 3.", "Answer two."),
            ("Follow-up 4.", "Answer three."),
        ],
        strict=True,
    ):
        assert prompt.rstrip().endswith(message), prompt
        assert previous_answer in prompt and prompt.index(previous_answer) < prompt.index(message)


@pytest.mark.parametrize("kind", KINDS)
def test_interrupting_a_turn_mid_tool_call_stops_it_and_the_model_reads_what_it_wrote(
    kind, baton, model_server, tmp_path
):
    command = "echo $$ > sleeper.pid; exec sleep 120"
    model_server.set_turns([tool_call(kind, command), {"text": "Using tenacity now."}])
    with worker(baton, model_server, tmp_path, [kind]) as running:
        task = baton.create(executor=kind, message="Add retries to the uploader.")
        pid_file = running.workspace_root / str(task["id"]) / "sleeper.pid"
        wait_for(lambda: pid_file.exists() and pid_file.read_text().strip() != "", running)
        sleeper = int(pid_file.read_text())
        wait_for(
            lambda: any(
                event["type"] == "tool_started"
                for event in baton.task(task["id"])["turns"][1]["progress_events"] or []
            ),
            running,
        )
        interrupted_at = time.monotonic()
        turns = send(baton, task["id"], "Stop: use tenacity instead.", strategy="interrupt")
        assert [t["role"] for t in turns] == ["USER", "ASSISTANT"]  # the round starts now
        # The interrupted executor's tool command is gone within the worker's claim check.
        wait_for(lambda: not _alive(sleeper), running, timeout=10)
        stopped_after = time.monotonic() - interrupted_at
        done = baton.wait(task["id"])
    assert stopped_after < 4, stopped_after
    assert [(t["status"], t["error_code"]) for t in done["turns"]] == [
        ("COMPLETED", ""),
        ("INTERRUPTED", "interrupted"),
        ("COMPLETED", ""),
        ("COMPLETED", ""),
    ]
    assert done["turns"][3]["result"]["value"] == "Using tenacity now."
    # The new turn's prompt shows the interrupted turn, then the new message.
    last = prompts(model_server)[-1]
    assert "Interrupted by the next message before it finished." in last
    assert last.index("Interrupted by the next message") < last.index("Stop: use tenacity")
    assert last.rstrip().endswith("Stop: use tenacity instead.")
