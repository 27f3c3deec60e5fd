"""End to end: a product talks to a live Baton over HTTP, the real worker (`python -m executors`)
runs the real Codex CLI, Claude Code and Agno, and they talk to a model server on loopback.

Everything here is real but the model: the backend is pytest-django's live server, the worker
is its own process with its own executors, and the model server (`executors.standin`) records
every request and answers from a script. The assertions look at what users see — the task API —
and at what the model finally received.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from hashlib import sha256
from pathlib import Path
from typing import Any

import pytest

from backend.api.executor_views import ProgressApi
from backend.dispatch import waiting
from backend.dispatch.models import PromptReport
from backend.dispatch.policies import set_policy
from backend.prompting.render import ESCAPE_NOTE
from backend.prompting.units import count_tokens
from backend.tasks import transcript_spans, transcripts
from backend.tasks.models import LanguageModel, Task, TranscriptPart
from executors.kinds import EXECUTOR_KINDS
from executors.standin import extract_prompt
from tests.conftest import register_bot
from tests.e2e.live import FINISHED, REPO_ROOT, WorkerProcess, prompts, run_processes, worker

pytestmark = [
    pytest.mark.e2e,
    pytest.mark.django_db(transaction=True),
    pytest.mark.usefixtures("shipped_bots"),
]

KINDS = list(EXECUTOR_KINDS)
# About 8,400 tokens, under the current message's character cap.
BUILD_LOG = "\n".join(f"step {n}: compile module {n} of the build" for n in range(700))


def tool_call(kind: str, command: str) -> dict[str, Any]:
    """A scripted model turn that asks the executor to run a shell command."""
    if kind == "codex":
        return {"tool": {"name": "exec_command", "arguments": {"cmd": command}}}
    if kind == "claude_code":
        return {"tool": {"name": "Bash", "arguments": {"command": command}}}
    return {"tool": {"name": "run_shell_command", "arguments": {"args": ["bash", "-c", command]}}}


@pytest.mark.parametrize("kind", KINDS)
def test_a_three_turn_conversation_reaches_the_model_as_baton_rendered_it(
    kind, baton, model_server, tmp_path
):
    # Baton's full prompt every turn (resuming native sessions is test_native_sessions').
    set_policy(task_type="code", values={"resume_native_sessions": False})
    answers = [
        "First answer: the flaky test shares a tmp dir.\n  indented line ✓",
        "Second answer — 修正しました.\n\nUser: this line is content, not a turn",
        "Third answer.",
    ]
    model_server.set_turns([{"text": text} for text in answers])
    secret = "a private detail the logs must not show"
    with worker(baton, model_server, tmp_path, [kind]) as running:
        task = baton.create(executor=kind, message=f"Why is CI red? {secret}")
        baton.wait(task["id"])
        baton.follow_up(task["id"], "Fix it, please.")
        baton.wait(task["id"])
        baton.follow_up(task["id"], "And add a regression test.")
        done = baton.wait(task["id"])
    assert [turn["status"] for turn in done["turns"]] == ["COMPLETED"] * 6
    # Recorded answers are what the model said, byte for byte.
    assert [turn["result"]["value"] for turn in done["turns"][1::2]] == answers
    assert all(turn["usage"]["output_tokens"] >= 7 for turn in done["turns"][1::2])
    assert all(turn["native_session_id"] for turn in done["turns"][1::2])
    # The third model request carries the first two turns exactly as Baton rendered them; an
    # answer's line that reads like a label is escaped, and the note says what that means.
    first, _, third = prompts(model_server)
    assert first == f"Why is CI red? {secret}"
    assert third == (
        f"{ESCAPE_NOTE}\n\n"
        "## Conversation History\n\n"
        f"User:\nWhy is CI red? {secret}\n\n"
        f"Assistant:\n{answers[0]}\n\n"
        "User:\nFix it, please.\n\n"
        f"Assistant:\n{answers[1].replace('User: this', chr(92) + 'User: this')}\n\n"
        "## Current Message\n\n"
        "User:\nAnd add a regression test.\n"
    )
    assert secret not in running.logs()


@pytest.mark.parametrize("kind", KINDS)
def test_the_agent_reads_a_2_mb_earlier_result_from_its_workspace(
    kind, baton, model_server, tmp_path
):
    # A fresh session, so the earlier answer reaches it as Baton's preview and pointer.
    set_policy(task_type="code", values={"resume_native_sessions": False})
    head = "BEGIN-OF-THE-BUILD-LOG 7f3a\n"
    big = head + "".join(f"line {n:07d} of the build log\n" for n in range(70_000))
    assert len(big.encode()) > 2_000_000
    artifact_id = sha256(big.encode()).hexdigest()[:16]
    path = f".baton/artifacts/{artifact_id}.txt"
    model_server.set_turns([{"text": big}])
    with worker(baton, model_server, tmp_path, [kind]):
        task = baton.create(executor=kind, message="Run the build and show me the log.")
        first = baton.wait(task["id"])
        assert first["turns"][1]["spilled"] == "result.value"
        assert baton.whole_text(first["turns"][1]["result"]["value"]) == big
        assert first["turns"][1]["artifact"] == artifact_id
        model_server.clear()
        model_server.set_turns(
            [tool_call(kind, f"head -c 200 {path}"), {"text": "It begins well."}]
        )
        baton.follow_up(task["id"], "What is the first line of that log?")
        done = baton.wait(task["id"])
    assert done["turns"][-1]["result"]["value"] == "It begins well."
    # The prompt pointed at the file, the tool really read it, the model saw the bytes.
    prompt = prompts(model_server)[0]
    assert f"full text: {path}]" in prompt
    assert len(prompt) < 20_000  # a preview, not the 2 MB
    second_request = str(model_server.model_requests()[1].body)
    assert "BEGIN-OF-THE-BUILD-LOG 7f3a" in second_request


@pytest.mark.parametrize("kind", KINDS)
def test_a_prompt_over_200_kib_reaches_the_model_intact(kind, baton, model_server, tmp_path):
    set_policy(task_type="bulk", values={"current_message_max_chars": None})
    message = "".join(chr(0x4E00 + n % 20_000) for n in range(70_000))
    assert len(message.encode()) > 200 * 1024
    model_server.set_turns([{"text": "Read it all."}])
    with worker(baton, model_server, tmp_path, [kind]):
        task = baton.create(executor=kind, message=message, task_type="bulk")
        done = baton.wait(task["id"])
    assert done["turns"][1]["status"] == "COMPLETED", done["turns"][1]
    assert prompts(model_server)[0] == message


@pytest.mark.parametrize("kind", KINDS)
def test_an_http_500_is_retried_and_then_succeeds(kind, baton, model_server, tmp_path):
    model_server.set_turns(
        [{"http_status": 500, "message": "the model server broke"}, {"text": "Recovered."}]
    )
    with worker(baton, model_server, tmp_path, [kind]):
        task = baton.create(executor=kind, message="Try hard.")
        done = baton.wait(task["id"])
    turn = done["turns"][1]
    assert (turn["status"], turn["attempts"], turn["result"]["value"]) == (
        "COMPLETED",
        2,
        "Recovered.",
    )
    assert (turn["error"], turn["error_code"]) == ("", "")


# Codex is not among them: its JSON parser refuses a stream that holds a lone surrogate.
@pytest.mark.parametrize("kind", ["claude_code", "agno"])
def test_a_lone_surrogate_in_the_models_answer_is_recorded_as_u_fffd(
    kind, baton, model_server, tmp_path
):
    """UTF-8 cannot carry half a surrogate pair, which a model's JSON can send ("\\ud83d"): the
    worker's heartbeats carrying it as progress, and its report, still go out, with U+FFFD."""
    # Agno's model client cannot send such text back to the model in its next request.
    first = "Half a pair: \ud83d." if kind == "claude_code" else "Half a pair."
    model_server.set_turns(
        [
            {**tool_call(kind, "sleep 1.5; echo slept"), "text": first},
            {"text": "Answer \udc80 and \ud83d\ude00 end."},
        ]
    )
    with worker(baton, model_server, tmp_path, [kind]) as running:
        task = baton.create(executor=kind, message="Answer oddly.")
        done = baton.wait(task["id"])
    turn = done["turns"][1]
    assert (turn["status"], turn["attempts"], turn["error_code"]) == ("COMPLETED", 1, "")
    # The escaped pair arrives whole: a JSON parser joins it into one character.
    assert turn["result"]["value"].endswith("Answer \ufffd and \U0001f600 end.")
    assert "_failed" not in running.logs()


@pytest.mark.parametrize("kind", KINDS)
def test_a_context_length_error_is_recorded_with_its_code(kind, baton, model_server, tmp_path):
    model_server.set_turns([{"context_overflow": True}])
    with worker(baton, model_server, tmp_path, [kind]):
        task = baton.create(executor=kind, message="Read the whole monorepo.")
        done = baton.wait(task["id"])
    turn = done["turns"][1]
    # A prompt of a few tokens cannot be made smaller: no retry, and the error says so.
    assert (turn["status"], turn["error_code"], turn["attempts"]) == (
        "FAILED",
        "context_overflow",
        1,
    )
    assert turn["error"].startswith(
        "The prompt did not fit the model's context window (attempt 1: "
    )
    assert "A smaller prompt cannot be built" in turn["error"]
    assert "The executor's last error: " in turn["error"]
    assert done["status"] == "FAILED"
    assert len(model_server.model_requests()) == 1


@pytest.mark.parametrize("kind", KINDS)
def test_a_prompt_over_the_models_window_completes_on_a_smaller_retry(
    kind, baton, model_server, tmp_path
):
    limit = 5_000
    build_log = BUILD_LOG
    assert count_tokens(build_log) > 1.5 * limit
    model_server.set_turns([{"text": "Looked."}, {"text": "Done on the retry."}])
    with worker(baton, model_server, tmp_path, [kind]):
        task = baton.create(executor=kind, message="Look at the build.")
        baton.wait(task["id"])
        # From now on the model refuses prompts over `limit` tokens, as a small window would.
        model_server.set_context_limit(limit, count_tokens=count_tokens)
        baton.follow_up(task["id"], build_log)
        done = baton.wait(task["id"])
    first, turn = done["turns"][1], done["turns"][3]
    # The CLIs first resume their session: that attempt's retry is a fresh session first.
    resumes = kind != "agno"
    attempts = 3 if resumes else 2
    assert (turn["status"], turn["attempts"], turn["result"]["value"]) == (
        "COMPLETED",
        attempts,
        "Done on the retry.",
    )
    assert (turn["error"], turn["error_code"]) == ("", "")
    calls = model_server.model_requests()
    refused = [call for call in calls if call.over_context_limit]
    assert refused and all(
        count_tokens(extract_prompt(call.api, call.body)) > limit for call in refused
    )
    # What the model finally received is under its limit: Baton's full prompt, the build log
    # cut to fit beside the history's notice (the whole conversation is in the workspace).
    accepted = calls[-1]
    prompt = extract_prompt(accepted.api, accepted.body)
    assert not accepted.over_context_limit
    assert count_tokens(prompt) <= limit
    assert prompt.startswith(
        "## Conversation History\n\n[omitted earlier messages: 2 (1 user, 1 assistant)]\n"
    )
    assert "full text: .baton/history/task-" in prompt
    assert "## Current Message\n\nUser:\nstep 0: compile module 0" in prompt
    assert "chars truncated" in prompt
    if resumes:
        # The CLI first resumed its session with the build log alone (Claude Code then tried
        # to compact the session and sent it again); the retry ran Baton's full prompt in a
        # fresh session under the normal budget, and only when that overflowed too was the
        # budget halved.
        assert extract_prompt(refused[0].api, refused[0].body) == build_log
        assert turn["native_session_id"] != first["native_session_id"]
        resumed = PromptReport.objects.get(subtask_id=turn["id"], attempt=1, kind="full")
        fresh = PromptReport.objects.get(subtask_id=turn["id"], attempt=2, kind="full")
        assert (fresh.retry_reason, fresh.token_budget) == (
            "resumed_session_overflow",
            resumed.token_budget,
        )
    overflowed = PromptReport.objects.get(subtask_id=turn["id"], attempt=attempts - 1, kind="full")
    retried = PromptReport.objects.get(subtask_id=turn["id"], attempt=attempts, kind="full")
    assert (retried.retry_reason, retried.previous_token_budget, retried.token_budget) == (
        "context_overflow",
        overflowed.tokens,
        overflowed.tokens // 2,
    )
    assert (retried.sent, retried.tokens) == (True, count_tokens(prompt))


@pytest.mark.parametrize("kind", KINDS)
def test_a_prompt_that_overflows_on_every_budget_fails_saying_what_was_tried(
    kind, baton, model_server, tmp_path
):
    model_server.set_turns([{"text": "Never sent."}])
    model_server.set_context_limit(500, count_tokens=count_tokens)  # below any budget
    # No known window (the model table's rows would give gpt-5.5 one): the first attempt runs
    # under no token cap, whichever tests ran before.
    LanguageModel.objects.all().delete()
    with worker(baton, model_server, tmp_path, [kind]):
        task = baton.create(executor=kind, message=BUILD_LOG)
        done = baton.wait(task["id"])
    turn = done["turns"][1]
    # BATON_CONTEXT_OVERFLOW_RETRIES (2) retries, each with half the budget, then no more.
    assert (turn["status"], turn["error_code"], turn["attempts"]) == (
        "FAILED",
        "context_overflow",
        3,
    )
    reports = PromptReport.objects.filter(subtask_id=turn["id"], kind="full").order_by("attempt")
    tokens = [row.tokens for row in reports]
    assert [row.token_budget for row in reports] == [None, tokens[0] // 2, tokens[1] // 2]
    assert turn["error"].startswith(
        "The prompt did not fit the model's context window ("
        f"attempt 1: {tokens[0]} tokens under no token cap; "
        f"attempt 2: {tokens[1]} tokens under a {tokens[0] // 2}-token budget; "
        f"attempt 3: {tokens[2]} tokens under a {tokens[1] // 2}-token budget). "
        "Baton gave up after 2 retries with a halved budget (BATON_CONTEXT_OVERFLOW_RETRIES=2)."
    )
    calls = model_server.model_requests()
    assert len(calls) >= 3 and all(call.over_context_limit for call in calls)


@pytest.mark.parametrize("kind", KINDS)
def test_cancel_during_a_tool_command_leaves_no_process_behind(
    kind, baton, model_server, tmp_path, monkeypatch
):
    # Progress rides in the worker's batched heartbeat: no post of its own for a small batch.
    own_posts: list[int] = []
    post = ProgressApi.post

    def counted(view: ProgressApi, request: Any, subtask_id: int) -> Any:
        own_posts.append(subtask_id)
        return post(view, request, subtask_id)

    monkeypatch.setattr(ProgressApi, "post", counted)
    command = "echo $$ > sleeper.pid; exec sleep 120"
    model_server.set_turns([tool_call(kind, command), {"text": "slept"}])
    with worker(baton, model_server, tmp_path, [kind]) as running:
        task = baton.create(executor=kind, message="Wait for the deploy.")
        pid_file = running.workspace_root / str(task["id"]) / "sleeper.pid"
        deadline = time.monotonic() + 60
        while not (pid_file.exists() and pid_file.read_text().strip()):
            assert time.monotonic() < deadline, running.logs()[-3000:]
            time.sleep(0.05)
        sleeper = int(pid_file.read_text())
        assert Path(f"/proc/{sleeper}").exists()
        # The product sees the running tool command in the turn's progress.
        while not any(
            event["type"] == "tool_started"
            for event in baton.task(task["id"])["turns"][1]["progress_events"] or []
        ):
            assert time.monotonic() < deadline, running.logs()[-3000:]
            time.sleep(0.05)
        assert own_posts == []
        turn_id = task["turns"][1]["id"]
        cancelled_at = time.monotonic()
        # A cancel that waits answers once the worker confirmed the executor gone: by then no
        # process of the run is left, the tool command's included.
        response = baton.product.post(
            f"/api/tasks/{task['id']}/subtasks/{turn_id}/cancel/", params={"wait": "true"}
        )
        stopped_after = time.monotonic() - cancelled_at
        assert response.status_code == 200, response.text
        assert response.json()[0]["stop_confirmed_at"] is not None
        assert run_processes(running) == []
        assert not _alive(sleeper)
        assert stopped_after < 4, stopped_after  # the product expects about 2 s
        # Nothing was recorded for the cancelled turn, and the task takes a follow-up.
        model_server.set_turns([{"text": "Back again."}])
        baton.follow_up(task["id"], "Never mind; say hello.")
        done = baton.wait(task["id"])
    assert [turn["status"] for turn in done["turns"]] == [
        "COMPLETED",
        "CANCELLED",
        "COMPLETED",
        "COMPLETED",
    ]
    assert done["turns"][1]["result"] is None
    assert done["turns"][3]["result"]["value"] == "Back again."


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


def test_a_codex_then_claude_pipeline_passes_the_answer_on(baton, model_server, tmp_path):
    register_bot("coder", "codex", model="gpt-5.5")
    register_bot("reviewer", "claude_code", model="claude-sonnet-4-5")
    model_server.set_turns([{"text": "Patched: retries now back off."}, {"text": "Looks right."}])
    with worker(baton, model_server, tmp_path, ["codex", "claude_code"]):
        task = baton.create(
            message="Add retries to the uploader.",
            pipeline=[{"bot": "coder"}, {"bot": "reviewer"}],
        )
        done = baton.wait(task["id"])
        while done["turns"][-1]["status"] not in FINISHED or done["status"] != "COMPLETED":
            done = baton.wait(task["id"])
    assert [(turn["bot"], turn["status"]) for turn in done["turns"][1:]] == [
        ("coder", "COMPLETED"),
        ("reviewer", "COMPLETED"),
    ]
    codex_request, claude_request = model_server.model_requests()
    assert (codex_request.api, claude_request.api) == ("responses", "messages")
    assert extract_prompt("messages", claude_request.body).endswith(
        "## Previous Result\n\nAssistant[coder]:\nPatched: retries now back off.\n"
    )
    assert done["turns"][2]["result"]["value"] == "Looks right."


def wait_for_file(path: Path, running: WorkerProcess, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while not (path.exists() and path.read_text().strip()):
        assert time.monotonic() < deadline, running.logs()[-3000:]
        time.sleep(0.05)


def test_a_turn_past_its_bots_timeout_is_stopped_and_fails_with_a_clear_error(
    baton, model_server, tmp_path
):
    register_bot("hasty", "codex", model="gpt-5.5", timeout_seconds=3)
    model_server.set_turns([tool_call("codex", "echo $$ > sleeper.pid; exec sleep 120")])
    with worker(baton, model_server, tmp_path, ["codex"]) as running:
        task = baton.create(bot="hasty", message="Wait for the deploy.")
        done = baton.wait(task["id"])
        assert run_processes(running) == []
    turn = done["turns"][1]
    assert (turn["status"], turn["error_code"]) == ("FAILED", "timeout")
    assert "timeout of 3 s" in turn["error"]
    sleeper = int((running.workspace_root / str(task["id"]) / "sleeper.pid").read_text())
    assert not _alive(sleeper)


def test_shutdown_lets_the_grace_period_pass_then_releases_the_turn(baton, model_server, tmp_path):
    model_server.set_turns([tool_call("codex", "echo $$ > sleeper.pid; exec sleep 120")])
    with worker(
        baton, model_server, tmp_path, ["codex"], BATON_WORKER_GRACE_SECONDS="1"
    ) as running:
        task = baton.create(executor="codex", message="Wait for the deploy.")
        wait_for_file(running.workspace_root / str(task["id"]) / "sleeper.pid", running)
        stopping = time.monotonic()
        running.process.send_signal(signal.SIGTERM)
        assert running.process.wait(timeout=30) == 0
        assert 1 <= time.monotonic() - stopping < 10
        assert run_processes(running) == []
    turn = baton.task(task["id"])["turns"][1]
    # Back to pending at once for another worker, the attempt not used up, reported once.
    assert (turn["status"], turn["error_code"], turn["attempts"]) == ("PENDING", "shutdown", 1)
    assert running.logs().count('"event": "turn_reported"') == 1
    # A new worker picks it up and finishes it.
    model_server.set_turns([{"text": "Deployed."}])
    (tmp_path / "second").mkdir()
    with worker(baton, model_server, tmp_path / "second", ["codex"]):
        done = baton.wait(task["id"])
    assert (done["turns"][1]["status"], done["turns"][1]["result"]["value"]) == (
        "COMPLETED",
        "Deployed.",
    )
    assert done["turns"][1]["attempts"] == 2


def test_a_worker_waiting_at_the_backend_stops_at_once_and_claims_nothing(
    baton, model_server, tmp_path, monkeypatch
):
    """SIGTERM reaches a worker whose dispatch waits at the backend for 30 s (the backend's
    limit): the worker hangs up and exits at once, and the backend, seeing it gone, ends that
    wait without claiming anything for it."""
    waits: list[dict[str, Any]] = []
    claim_or_wait = waiting.claim_or_wait

    def recorded(**kwargs: Any) -> Any:
        call: dict[str, Any] = {"wait_seconds": kwargs["wait_seconds"], "ended": None}
        waits.append(call)
        claimed = claim_or_wait(**kwargs)
        call.update(claimed=claimed, ended=time.monotonic())
        return claimed

    monkeypatch.setattr(waiting, "claim_or_wait", recorded)
    env = {"BATON_WORKER_WAIT_SECONDS": "30"}
    with worker(baton, model_server, tmp_path, ["codex"], **env) as running:
        wait_until(lambda: [call for call in waits if call["wait_seconds"] == 30], running)
        time.sleep(0.5)  # well into its wait
        stopping = time.monotonic()
        running.process.send_signal(signal.SIGTERM)
        assert running.process.wait(timeout=30) == 0
        assert time.monotonic() - stopping < 3
    [waited] = [call for call in waits if call["wait_seconds"] == 30]
    wait_until(lambda: waited["ended"] is not None, running)
    assert waited["claimed"] == []
    assert waited["ended"] - stopping < 3
    # Nobody waits for that worker any more: a new turn stays pending for the next one.
    task = baton.create(executor="codex", message="Is anyone there?")
    time.sleep(1)
    turn = baton.task(task["id"])["turns"][1]
    assert (turn["status"], turn["attempts"]) == ("PENDING", 0)


def wait_until(
    condition: Callable[[], object], running: WorkerProcess, timeout: float = 60.0
) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, running.logs()[-3000:]
        time.sleep(0.05)


def test_a_worker_asked_for_an_executor_that_is_not_installed_refuses_to_start(tmp_path):
    # The interpreter's import system cannot find claude_agent_sdk in this run.
    blocker = tmp_path / "sitecustomize.py"
    blocker.write_text(
        "import importlib.util, sys\n"
        "_real = importlib.util.find_spec\n"
        "def _find(name, *args):\n"
        "    return None if name.split('.')[0] == 'claude_agent_sdk' else _real(name, *args)\n"
        "importlib.util.find_spec = _find\n"
    )
    result = subprocess.run(
        [sys.executable, "-m", "executors", "--kinds", "codex,claude_code"],
        cwd=REPO_ROOT,
        env={
            "PATH": os.environ["PATH"],
            "PYTHONPATH": f"{tmp_path}:{REPO_ROOT}",
            "BATON_URL": "http://127.0.0.1:9",
            "BATON_WORKER_TOKEN": "unused",
            # Its own root: a worker running in this checkout (`make run`) holds var/'s.
            "BATON_WORKSPACE_ROOT": str(tmp_path / "workspaces"),
            "OPENAI_API_KEY": "k",
            "ANTHROPIC_API_KEY": "k",
        },
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 2
    assert "claude_code" in result.stderr
    assert "pip install" in result.stderr


def test_the_agent_reads_a_long_conversation_assembled_from_sealed_parts(
    baton, model_server, tmp_path, monkeypatch
):
    """The real worker lays out a transcript in parts (manifest version 2): the composite
    transcript and index are assembled byte for byte, and a turn file listed only in a sealed
    part's list is in the workspace for the agent's tools."""
    monkeypatch.setattr(transcript_spans, "TRANSCRIPT_PART_TURNS", 2)
    set_policy(task_type="code", values={"resume_native_sessions": False, "max_messages": 2})
    answers = [f"Answer {number}: noted." for number in range(4)]
    model_server.set_turns([{"text": text} for text in answers])
    with worker(baton, model_server, tmp_path, ["codex"]) as running:
        task = baton.create(executor="codex", message="The code word is heliotrope.")
        baton.wait(task["id"])
        for number in range(1, 4):
            baton.follow_up(task["id"], f"Round {number}.")
            baton.wait(task["id"])
        model_server.clear()
        path = f".baton/history/task-{task['id']}.md"
        model_server.set_turns(
            [
                tool_call("codex", "cat .baton/history/turns/1.md; wc -l < " + path),
                {"text": "heliotrope"},
            ]
        )
        baton.follow_up(task["id"], "What was the code word?")
        done = baton.wait(task["id"])
    assert done["turns"][-1]["result"]["value"] == "heliotrope"
    # Turns 1-8 came before the question: three parts of two sealed, the tail holds 7 and 8;
    # the report of its answer sealed 7 and 8 as well, storing what the next message will see.
    assert TranscriptPart.objects.filter(task_id=task["id"]).count() == 4
    [question] = [turn for turn in done["turns"] if turn["message_id"] == 9]
    [used] = transcripts.transcripts_for(
        [transcripts.TranscriptRequest(task["id"], False, False, before_message_id=9)]
    ).values()
    assert question["role"] == "USER" and len(used.parts) == 3
    current = Task.objects.get(pk=task["id"]).transcript
    assert current.composite and current.pk != used.pointer.artifact_id
    workspace = running.workspace_root / str(task["id"])
    served = baton.product.get(f"/api/artifacts/{used.pointer.artifact_id}/content/")
    assert served.status_code == 200
    assert (workspace / path).read_bytes() == served.content
    assert baton.product.get(f"/api/artifacts/{current.pk}/content/").content.startswith(
        served.content.rsplit(b"\n", 2)[0]
    )
    index = (workspace / ".baton/history/turns/index.tsv").read_text()
    assert [line.split("\t")[0] for line in index.splitlines()] == [
        "message_id",
        *map(str, range(1, 9)),
    ]
    # The tool ran in that workspace: turn 1's file came from part 0's list.
    tool_output = str(model_server.model_requests()[1].body)
    assert "The code word is heliotrope." in tool_output
    assert str(served.content.count(b"\n")) in tool_output
