"""A task's admin page reads as its conversation, and what it says about a long text is true."""

from __future__ import annotations

import html
import re

import pytest
from django.urls import reverse
from django.utils import timezone
from django.utils.html import escape

from backend.dispatch.claims import claim_turns
from backend.dispatch.models import PromptReport
from backend.prompting.truncate import truncation_marker
from backend.tasks.factories import conversation
from backend.tasks.models import Steer, Subtask, SubtaskStatus, Task
from backend.tasks.partial_texts import replace_partial_text
from backend.tasks.services import append_message, record_result
from tests.dispatch.steering import settle, steer
from tests.dispatch.test_admin import task_change_data
from tests.dispatch.test_dispatch_api import create, dispatch

pytestmark = [pytest.mark.django_db, pytest.mark.usefixtures("artifact_storage_in_tmp")]

LOG_CHARS = 300_669
TRACEBACK = (
    "Traceback (most recent call last):\n"
    '  File "upload.py", line 42, in send\n'
    "    raise TimeoutError('upload stalled')\n"
    "TimeoutError: upload stalled\n"
)
MARKER = re.compile(r"…(\d+) chars truncated…")


def command_log(chars: int = LOG_CHARS) -> str:
    """A test run's output of exactly `chars` characters with a traceback in its middle."""
    head = "".join(f"collecting tests/test_{n}.py ... ok\n" for n in range(200))
    progress = "".join(f"progress {n}: 1024 bytes sent\n" for n in range(20_000))
    half = (chars - len(head) - len(TRACEBACK)) // 2
    text = head + progress[: progress.rindex("\n", 0, half) + 1] + TRACEBACK
    text += progress[: chars - len(text) - 1] + "\n"
    assert len(text) == chars and len(progress) > chars
    return text


def long_log_task(*, owner, follow_ups: int = 0) -> Task:
    """A task whose second message is a 300,669-char log, then `follow_ups` more messages; the
    last message waits for a worker."""
    messages = ["Why does the upload test fail?", command_log(), "Run it again with retries."]
    messages += [f"Follow-up {n}?" for n in range(follow_ups)]
    return conversation(
        owner=owner,
        title="Fix the flaky upload test",
        messages=messages,
        answers=[f"Answer {n}." for n in range(len(messages) - 1)],
    )


def turn_block(page: str, message_id: int) -> str:
    """The HTML of one turn of the conversation."""
    match = re.search(
        rf'<div class="turn [^"]*" id="turn-{message_id}".*?(?=<div class="turn |</fieldset>)',
        page,
        re.DOTALL,
    )
    assert match, f"no turn {message_id} on the page"
    return match.group(0)


def task_page(admin_client, task: Task) -> str:
    response = admin_client.get(f"/admin/tasks/task/{task.pk}/change/")
    assert response.status_code == 200
    return response.content.decode()


def test_a_long_text_shows_the_stored_preview_and_its_true_sizes(admin_client, user):
    task = long_log_task(owner=user)
    log = Subtask.objects.get(task=task, message_id=3)
    assert log.history_is_preview and log.history_chars == LOG_CHARS
    block = turn_block(task_page(admin_client, task), 3)
    shown = html.unescape(re.search(r'<pre class="turn-text">(.*?)</pre>', block, re.S).group(1))
    # Exactly what the model sees, not cut again: its traceback, its markers.
    assert shown == log.history_text
    assert TRACEBACK in shown
    # Each marker counts what was left out of the whole text, so the kept text and the
    # markers' counts add up to the whole text's size.
    removed = [int(n) for n in MARKER.findall(shown)]
    assert removed and len(MARKER.sub("", shown)) + sum(removed) == LOG_CHARS
    # The true sizes: the whole text's and the preview's, and a link to the whole text.
    assert f"{LOG_CHARS} chars" in block
    assert f"preview shown: {len(log.history_text)} chars" in block
    url = reverse("artifact-content", kwargs={"artifact_id": log.artifact_id})
    assert f'<a class="whole-text" href="{url}">whole text</a>' in block
    whole = admin_client.get(url)
    assert whole.status_code == 200
    assert b"".join(whole.streaming_content if whole.streaming else [whole.content]).decode() == (
        command_log()
    )


def test_a_short_text_is_shown_whole_without_a_link(admin_client, user):
    task = long_log_task(owner=user)
    block = turn_block(task_page(admin_client, task), 1)
    assert "Why does the upload test fail?" in block
    assert "30 chars, 1 line," in block
    assert "whole-text" not in block
    assert "truncated" not in block


def test_the_turns_read_in_order_with_who_said_them(admin_client, user):
    task = long_log_task(owner=user, follow_ups=1)
    page = task_page(admin_client, task)
    ids = [int(n) for n in re.findall(r'<div class="turn [^"]*" id="turn-(\d+)"', page)]
    assert ids == list(range(1, 9))
    assert "Conversation (8 turns)" in page
    answer = turn_block(page, 2)
    # Named as everywhere in Baton: by its message id, with the subtask id and the message it
    # answered in its details.
    turn = Subtask.objects.get(task=task, message_id=2)
    assert (
        f'<a href="/admin/tasks/subtask/{turn.pk}/change/" class="turn-id">'
        "<strong>message 2</strong></a>"
    ) in answer
    assert "<dt>in reply to</dt><dd>message 1</dd>" in answer
    assert f"<dt>subtask id</dt><dd>{turn.pk}</dd>" in answer
    assert "<dt>in reply to</dt><dd>-</dd>" in turn_block(page, 1)
    assert "Assistant codex" in answer and "OpenAI Codex CLI" in answer
    assert "Completed" in answer and "Answer 0." in answer
    # The raw per-turn fields are folded.
    assert '<details class="turn-details">' in answer


def test_turn_text_is_escaped(admin_client, user):
    task = conversation(
        owner=user, messages=["<script>alert(1)</script> & co"], answers=["<b>bold</b>"]
    )
    page = task_page(admin_client, task)
    assert "<script>alert(1)</script>" not in page
    assert "&lt;script&gt;alert(1)&lt;/script&gt; &amp; co" in turn_block(page, 1)
    assert "&lt;b&gt;bold&lt;/b&gt;" in turn_block(page, 2)


def test_beside_each_assistant_turn_what_was_sent(admin_client, user, worker):
    task = long_log_task(owner=user)
    [claimed] = claim_turns(worker=worker, worker_id="w-1", kinds=["codex"], limit=1)
    page = task_page(admin_client, task)
    sent = turn_block(page, claimed.subtask.message_id)
    assert "full prompt offered" in sent  # the worker has not said which it ran yet
    assert "why: no_session" in sent
    assert re.search(r"\d+ of \d+ model tokens", sent)
    report = PromptReport.objects.get(subtask=claimed.subtask)
    url = reverse("admin:dispatch_promptreport_change", args=[report.pk])
    assert '<div class="dispatch-line">attempt 1 · worker w-1 · 1 prompt</div>' in sent
    assert f'<summary>prompt report <a href="{url}">{report.pk}</a></summary>' in sent
    # A user turn has nothing beside it.
    assert "sent-prompts" not in turn_block(page, 1)


def test_the_status_is_not_edited_by_hand(admin_client, user):
    task = long_log_task(owner=user)
    page = task_page(admin_client, task)
    assert 'name="status"' not in page
    # A form posted with a status changes what the form edits, never the status.
    data = task_change_data(admin_client, task, title="Renamed", status="COMPLETED")
    assert admin_client.post(f"/admin/tasks/task/{task.pk}/change/", data).status_code == 302
    changed = Task.objects.get(pk=task.pk)
    assert (changed.title, changed.status) == ("Renamed", task.status)
    assert task.status != "COMPLETED"


def test_the_page_costs_the_same_queries_however_many_turns(
    admin_client, user, worker, django_assert_max_num_queries
):
    task = long_log_task(owner=user)
    claim_turns(worker=worker, worker_id="w-1", kinds=["codex"], limit=1)
    with django_assert_max_num_queries(60) as few:
        task_page(admin_client, task)
    for n in range(5):
        [pending] = Subtask.objects.filter(task=task, status__in=["RUNNING", "PENDING"])
        record_result(subtask=pending, status=SubtaskStatus.COMPLETED, result={"value": f"{n}"})
        append_message(task=task, message=f"More {n}?")
        claim_turns(worker=worker, worker_id="w-1", kinds=["codex"], limit=1)
    assert task.subtasks.count() == 16  # 10 turns more than the first page showed
    with django_assert_max_num_queries(len(few.captured_queries)):
        task_page(admin_client, task)


def test_a_turn_page_shows_the_stored_preview_and_true_sizes(admin_client, user):
    task = long_log_task(owner=user)
    log = Subtask.objects.get(task=task, message_id=3)
    response = admin_client.get(f"/admin/tasks/subtask/{log.pk}/change/")
    assert response.status_code == 200
    raw = response.content.decode()
    # The stored preview whole, in a block that keeps its lines (a traceback's indentation).
    assert f'margin: 0">{escape(log.history_text)}</pre>' in raw
    page = html.unescape(raw)
    assert f"{LOG_CHARS} chars, {log.history_lines} lines, {LOG_CHARS} bytes" in page
    assert f"the preview below: {len(log.history_text)} chars" in page
    url = reverse("artifact-content", kwargs={"artifact_id": log.artifact_id})
    assert f'href="{url}" class="whole-text"' in page
    for marker in MARKER.findall(log.history_text):
        assert truncation_marker(int(marker)) in page


def test_a_running_turn_says_how_much_it_has_written(admin_client, user, worker):
    task = long_log_task(owner=user)
    [claimed] = claim_turns(worker=worker, worker_id="w-1", kinds=["codex"], limit=1)
    replace_partial_text(subtask=claimed.subtask, text="Looking at the log")
    claimed.subtask.save(update_fields=["partial_text", "partial_text_chars", "partial_text_bytes"])
    block = turn_block(task_page(admin_client, task), claimed.subtask.message_id)
    assert "18 chars written so far" in block


def test_steered_turns_say_where_they_went_and_what_became_of_them(admin_client, api, worker_api):
    task = create(api)
    [running] = dispatch(worker_api)
    received, also_received, refused, waiting = (
        steer(api, task, text) for text in ("And the docs.", "And tests.", "And lint.", "Ship.")
    )
    settle(worker_api, running, received["steer_id"])
    settle(worker_api, running, also_received["steer_id"])
    settle(worker_api, running, refused["steer_id"], refusal="finished")
    page = task_page(admin_client, Task.objects.get(pk=task["id"]))
    delivered_at = Steer.objects.get(pk=received["steer_id"]).delivered_at
    assert '<span class="turn-steer">steered into message 2 · received {}</span>'.format(
        timezone.localtime(delivered_at).strftime("%H:%M:%S")
    ) in turn_block(page, 3)
    assert (
        '<span class="turn-steer">steered into message 2 · fell back to the queue (finished)</span>'
        in turn_block(page, 5)
    )
    assert '<span class="turn-steer">steered into message 2 · waiting</span>' in turn_block(page, 6)
    received_line = "received steers: message 3, message 4"
    assert f'<span class="turn-steers-received">{received_line}</span>' in turn_block(page, 2)
    assert "turn-steer" not in turn_block(page, 1)


def test_a_steer_of_a_cancelled_task_says_so(admin_client, api, worker_api):
    task = create(api)
    dispatch(worker_api)
    steer(api, task, "And the docs.")
    assert api.post(f"/api/tasks/{task['id']}/cancel/").status_code == 200
    page = task_page(admin_client, Task.objects.get(pk=task["id"]))
    assert '<span class="turn-steer">steered into message 2 · cancelled</span>' in turn_block(
        page, 3
    )
    assert "received steers" not in page


def test_a_steer_a_newer_message_took_over_says_so(admin_client, api, worker_api):
    task = create(api)
    [running] = dispatch(worker_api)
    settle(worker_api, running, steer(api, task, "And the docs.")["steer_id"])
    stop = {"message": "Stop, do this instead.", "strategy": "interrupt"}
    assert api.post(f"/api/tasks/{task['id']}/messages/", stop, format="json").status_code == 201
    page = task_page(admin_client, Task.objects.get(pk=task["id"]))
    line = "steered into message 2 · left to the round of the message that stopped that turn"
    assert f'<span class="turn-steer">{line}</span>' in turn_block(page, 3)
    assert "received steers" not in page
