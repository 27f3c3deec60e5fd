"""The history policy and prompt report admin, and the prompt preview page."""

from __future__ import annotations

import html
import json
import re
from typing import Any

import pytest
from django.contrib.auth.models import Permission, User
from django.db import connection
from django.test import Client
from django.test.utils import CaptureQueriesContext

from backend.dispatch.admin import sets_and_inherits
from backend.dispatch.claims import claim_turns
from backend.dispatch.models import CAP_HELP, HistoryPolicy, PromptReport
from backend.dispatch.policies import POLICY_FIELDS, resolve_policy, row_values
from backend.dispatch.prompts import build_turn_prompt, next_turn_to_dispatch
from backend.prompting import history_files_note
from backend.tasks.factories import answered_task, conversation
from backend.tasks.models import Bot, NativeSession, Subtask, SubtaskStatus, Task
from backend.tasks.services import PipelineStep, append_message, create_task, record_result

pytestmark = [pytest.mark.django_db, pytest.mark.usefixtures("pipeline_bots")]

PREVIEW_URL = "/admin/dispatch/historypolicy/preview/"
DRAFT_URL = "/admin/dispatch/historypolicy/preview/draft/"

# A known small task: one answered question and a follow-up waiting for its answer.
SMALL_TASK_PROMPT = (
    "## Conversation History\n"
    "\n"
    "User:\n"
    "What is 2+2?\n"
    "\n"
    "Assistant:\n"
    "4\n"
    "\n"
    "## Current Message\n"
    "\n"
    "User:\n"
    "And 3+3?\n"
)


def converse(*, owner, exchanges: list[tuple[str, str]], follow_up: str, task_type="code") -> Task:
    """A task with answered `(question, answer)` exchanges and a pending `follow_up`."""
    return conversation(
        owner=owner,
        title="Preview me",
        task_type=task_type,
        messages=[question for question, _ in exchanges] + [follow_up],
        answers=[answer for _, answer in exchanges],
    )


def long_task(*, owner, rounds: int = 6) -> Task:
    return converse(
        owner=owner,
        exchanges=[(f"Question {n}?", f"Answer {n}.") for n in range(1, rounds + 1)],
        follow_up="Last question?",
    )


def form_data(values: dict[str, Any]) -> dict[str, str]:
    """Cap values as a browser submits them (unchecked boxes are absent, None is blank)."""
    data = {}
    for name, value in values.items():
        if value is True:
            data[name] = "on"
        elif value is None:
            data[name] = ""
        elif value is not False:
            data[name] = str(value)
    return data


def change_data(row: HistoryPolicy, **changes: Any) -> dict[str, Any]:
    """The change form as a browser posts it: the values shown, the row's ticked fields."""
    return {
        **form_data({**row_values(row), **changes}),
        "set_here": list(row.overrides),
        "_save": "Save",
    }


def shown_prompt(page: str) -> str:
    match = re.search(r'<pre id="prompt-text">\n(.*?)</pre>', page, re.DOTALL)
    assert match, "no prompt on the page"
    return html.unescape(match.group(1))


def data_snapshot() -> dict[str, Any]:
    """Everything a preview could conceivably write."""
    return {
        "reports": PromptReport.objects.count(),
        "policies": sorted(
            HistoryPolicy.objects.values_list(
                "task_type", "version", "max_messages", "updated_by", "updated_at"
            )
        ),
        "turns": sorted(
            Subtask.objects.values_list(
                "id", "status", "attempts", "lease_owner", "pending_since", "updated_at"
            )
        ),
        "tasks": sorted(Task.objects.values_list("id", "status", "updated_at")),
    }


# --- HistoryPolicy admin -----------------------------------------------------------------------


def test_changelist_lists_the_policies_with_a_preview_button(admin_client):
    response = admin_client.get("/admin/dispatch/historypolicy/")
    assert response.status_code == 200
    page = response.content.decode()
    assert ">default</a>" in page
    assert ">code</a>" in page
    assert ">chat</a>" in page
    assert f'href="{PREVIEW_URL}"' in page


@pytest.mark.parametrize(
    ("overrides", "shown"),
    [
        ([], "sets: nothing · inherits: all 17"),
        (["max_chars", "max_messages"], "sets: max_messages, max_chars · inherits: the other 15"),
        (["summary_max_chars"], "sets: summary_max_chars · inherits: the other 16"),
        (list(POLICY_FIELDS), "sets: all 17 · inherits: nothing"),
    ],
)
def test_sets_and_inherits_names_the_set_caps_in_form_order(overrides, shown):
    assert len(POLICY_FIELDS) == 17
    assert sets_and_inherits(overrides) == shown


def test_changelist_shows_which_caps_each_row_sets_and_inherits(admin_client):
    HistoryPolicy.objects.create(task_type="review", overrides=list(POLICY_FIELDS))
    page = html.unescape(admin_client.get("/admin/dispatch/historypolicy/").content.decode())
    cells = dict(
        re.findall(
            r'<th class="field-task_type_label"><a [^>]*>([^<]*)</a></th>'
            r'<td class="field-sets_and_inherits_label"><span title="[^"]*">([^<]*)</span></td>',
            page,
        )
    )
    assert cells == {
        "default": "sets: nothing · inherits: all 17",
        "chat": "sets: max_messages, max_chars · inherits: the other 15",
        "code": "sets: nothing · inherits: all 17",
        "review": "sets: all 17 · inherits: nothing",
    }
    assert '<span title="inherits: enabled, per_message_max_chars, max_tokens, ' in page


def test_change_page_groups_the_caps_with_their_help(admin_client):
    row = HistoryPolicy.objects.get(task_type="code")
    response = admin_client.get(f"/admin/dispatch/historypolicy/{row.pk}/change/")
    assert response.status_code == 200
    page = response.content.decode()
    for help_text in CAP_HELP.values():
        assert help_text in html.unescape(page)
    for heading in ("History selection", "Tokens", "Change record"):
        assert heading in page
    assert f"{PREVIEW_URL}?policy={row.pk}" in page
    # Renaming would move the caps to another task type; version and author are recorded.
    assert 'name="task_type"' not in page
    assert 'name="version"' not in page
    assert 'name="max_messages"' in page


def test_add_page_renders_and_adds_a_row_at_version_one(admin_client, superuser):
    assert admin_client.get("/admin/dispatch/historypolicy/add/").status_code == 200
    data = {**form_data(row_values(HistoryPolicy(task_type="research"))), "_save": "Save"}
    response = admin_client.post(
        "/admin/dispatch/historypolicy/add/", {**data, "task_type": "research"}
    )
    assert response.status_code == 302
    row = HistoryPolicy.objects.get(task_type="research")
    assert (row.version, row.updated_by) == (1, superuser)


def test_add_refuses_a_task_type_that_is_not_a_slug(admin_client):
    data = {**form_data(row_values(HistoryPolicy())), "task_type": "Not A Slug", "_save": "Save"}
    response = admin_client.post("/admin/dispatch/historypolicy/add/", data)
    assert response.status_code == 200
    assert "task_type must be 1-64 characters" in response.content.decode()
    assert not HistoryPolicy.objects.filter(task_type="Not A Slug").exists()


@pytest.mark.parametrize(
    ("changes", "field", "reason"),
    [
        ({"max_tokens": 10}, "max_tokens", "must be at least 1024"),
        ({"max_messages": 0}, "max_messages", "positive"),
        ({"token_encoding": "no_such_encoding"}, "token_encoding", "Select a valid choice"),
        (
            {"per_message_max_chars": 50_000},
            "per_message_max_chars",
            "per_message_max_chars must not exceed",
        ),
    ],
)
def test_invalid_values_are_refused_with_the_reason(admin_client, changes, field, reason):
    row = HistoryPolicy.objects.get(task_type="code")
    response = admin_client.post(
        f"/admin/dispatch/historypolicy/{row.pk}/change/", change_data(row, **changes)
    )
    assert response.status_code == 200
    form = response.context["adminform"].form
    errors = form.errors[field] if field else form.non_field_errors()
    assert any(reason in error for error in errors), form.errors
    assert reason in html.unescape(response.content.decode())
    row.refresh_from_db()
    assert (row.version, row.max_messages, row.max_tokens) == (1, 20, None)


@pytest.mark.parametrize(
    "field",
    [
        "max_messages",
        "max_chars",
        "per_message_max_chars",
        "max_tokens",
        "previous_result_max_chars",
        "current_message_max_chars",
    ],
)
@pytest.mark.parametrize(
    ("value", "reason"),
    [
        (2**31, "at most 2147483647"),
        (2**63, "at most 2147483647"),
        (-1, "greater than or equal to 0"),
    ],
)
def test_a_cap_beyond_its_column_is_a_form_error(admin_client, field, value, reason):
    row = HistoryPolicy.objects.get(task_type="code")
    before = (row.version, row_values(row))
    response = admin_client.post(
        f"/admin/dispatch/historypolicy/{row.pk}/change/", change_data(row, **{field: value})
    )
    assert response.status_code == 200
    form = response.context["adminform"].form
    assert any(reason in error for error in form.errors[field]), form.errors
    row.refresh_from_db()
    assert (row.version, row_values(row)) == before


def test_summaries_are_turned_on_with_a_registered_bot(admin_client):
    row = HistoryPolicy.objects.get(task_type="code")
    url = f"/admin/dispatch/historypolicy/{row.pk}/change/"
    page = admin_client.get(url).content.decode()
    assert "Summaries of omitted history" in page
    response = admin_client.post(url, change_data(row, summaries_enabled=True, summary_bot="ghost"))
    assert response.status_code == 200
    errors = response.context["adminform"].form.errors
    assert "not registered" in errors["summary_bot"][0]
    response = admin_client.post(url, change_data(row, summaries_enabled=True))
    assert (
        "summary_bot must name the bot"
        in response.context["adminform"].form.errors["summary_bot"][0]
    )
    response = admin_client.post(
        url, change_data(row, summaries_enabled=True, summary_bot="summarizer")
    )
    assert response.status_code == 302
    policy = resolve_policy(task_type="code").policy
    assert (policy.summaries_enabled, policy.summary_bot) == (True, "summarizer")


def test_a_valid_save_bumps_the_version_and_records_the_admin(admin_client, superuser):
    row = HistoryPolicy.objects.get(task_type="code")
    url = f"/admin/dispatch/historypolicy/{row.pk}/change/"
    response = admin_client.post(url, change_data(row, max_messages=5, max_tokens=4096))
    assert response.status_code == 302
    row.refresh_from_db()
    assert (row.version, row.max_messages, row.max_tokens) == (2, 5, 4096)
    assert row.updated_by == superuser
    assert resolve_policy(task_type="code").policy.max_messages == 5
    # Saving the page unchanged is not a change: no new version.
    assert admin_client.post(url, change_data(row)).status_code == 302
    row.refresh_from_db()
    assert row.version == 2


def test_the_default_row_cannot_be_deleted(admin_client):
    default = HistoryPolicy.objects.get(task_type="")
    chat = HistoryPolicy.objects.get(task_type="chat")
    assert admin_client.get(f"/admin/dispatch/historypolicy/{default.pk}/delete/").status_code == (
        403
    )
    assert admin_client.post(f"/admin/dispatch/historypolicy/{default.pk}/delete/").status_code == (
        403
    )
    # Nor through the bulk action.
    response = admin_client.post(
        "/admin/dispatch/historypolicy/",
        {"action": "delete_selected", "_selected_action": [default.pk], "post": "yes"},
    )
    assert response.status_code == 403
    assert HistoryPolicy.objects.filter(pk=default.pk).exists()
    # Other rows can go (their task type then falls back to the default row).
    assert admin_client.get(f"/admin/dispatch/historypolicy/{chat.pk}/delete/").status_code == 200
    admin_client.post(f"/admin/dispatch/historypolicy/{chat.pk}/delete/", {"post": "yes"})
    assert not HistoryPolicy.objects.filter(pk=chat.pk).exists()


# --- PromptReport admin and the task page -----------------------------------------------------


@pytest.fixture
def dispatched(user, worker) -> PromptReport:
    converse(owner=user, exchanges=[("What is 2+2?", "4")], follow_up="And 3+3?")
    [claimed] = claim_turns(worker=worker, worker_id="w-1", kinds=["codex"], limit=1)
    return PromptReport.objects.get(subtask=claimed.subtask)


def test_prompt_report_admin_is_a_read_only_list(admin_client, dispatched):
    response = admin_client.get("/admin/dispatch/promptreport/")
    assert response.status_code == 200
    page = response.content.decode()
    assert "code v1" in page
    assert str(dispatched.task) in page
    for query in ("policy_source=row", "history_enabled__exact=1", "context_passing=none"):
        assert admin_client.get(f"/admin/dispatch/promptreport/?{query}").status_code == 200
    response = admin_client.get(f"/admin/dispatch/promptreport/{dispatched.pk}/change/")
    assert response.status_code == 200
    assert 'name="_save"' not in response.content.decode()
    for search in (str(dispatched.task_id), "w-1", "not-a-number"):
        assert admin_client.get("/admin/dispatch/promptreport/", {"q": search}).status_code == 200
    assert admin_client.get("/admin/dispatch/promptreport/add/").status_code == 403
    assert admin_client.post(
        f"/admin/dispatch/promptreport/{dispatched.pk}/change/", {"tokens": "1"}
    ).status_code == (403)


def test_task_page_shows_reports_artifacts_and_the_preview_button(admin_client, dispatched):
    response = admin_client.get(f"/admin/tasks/task/{dispatched.task_id}/change/")
    assert response.status_code == 200
    page = response.content.decode()
    assert "Dispatches and their prompts (1 dispatch, 1 prompt)" in page
    assert "w-1" in page  # the report's worker
    assert "code v1" in page
    assert "artifacts" in page.lower()
    assert f"{PREVIEW_URL}?task={dispatched.task_id}" in page


def test_task_page_query_count_does_not_grow_with_reports(
    admin_client, dispatched, django_assert_max_num_queries, worker
):
    task = dispatched.task
    with django_assert_max_num_queries(60) as few:
        admin_client.get(f"/admin/tasks/task/{task.pk}/change/")
    for n in range(3):
        pending = Subtask.objects.get(task=task, status=SubtaskStatus.RUNNING)
        record_result(subtask=pending, status="COMPLETED", result={"value": f"{n}"})
        append_message(task=task, message=f"More {n}?")
        claim_turns(worker=worker, worker_id="w-1", kinds=["codex"], limit=1)
    assert PromptReport.objects.filter(task=task).count() == 4
    baseline = len(few.captured_queries)
    # Each extra turn costs nothing per report; the subtask inline shows two more rows per round.
    with django_assert_max_num_queries(baseline):
        admin_client.get(f"/admin/tasks/task/{task.pk}/change/")


# --- the prompt preview page ------------------------------------------------------------------


def test_preview_shows_the_exact_prompt_of_the_next_dispatch(admin_client, user):
    Bot.objects.update(model="")  # a model the table does not know: no token budget
    task = converse(owner=user, exchanges=[("What is 2+2?", "4")], follow_up="And 3+3?")
    response = admin_client.get(PREVIEW_URL, {"task": task.pk})
    assert response.status_code == 200
    page = response.content.decode()
    assert shown_prompt(page) == SMALL_TASK_PROMPT
    # The same bytes dispatch would build.
    subtask = next_turn_to_dispatch(task=task)
    built = build_turn_prompt(
        subtask=subtask, task=task, resolved=resolve_policy(task_type=task.task_type)
    )
    assert shown_prompt(page) == built.build.text
    assert "code v1" in page
    # The turn named as everywhere: its message id, its subtask id, the message it answers.
    assert (
        f"<tr><th>Turn</th><td>message 4 (subtask {subtask.pk}, Pending, bot "
        f"{subtask.bot}, OpenAI Codex CLI), in reply to message 3</td></tr>"
    ) in page
    assert "2 considered, 2 included, 0 omitted" in page
    # The budget bar: history, current message (and no previous result for a first step).
    report = built.build.report
    share = report.history_tokens / report.tokens * 100
    assert f'class="segment segment-history" style="width: {share:.2f}%"' in page
    assert "segment-current" in page
    assert 'class="segment segment-previous_result"' not in page
    assert 'class="segment segment-unused"' not in page  # no max_tokens
    # Each history turn marked.
    assert 'class="turn mark-included" data-message-id="1"' in page
    assert 'class="turn mark-included" data-message-id="2"' in page


def test_each_preview_heading_holds_its_own_table(admin_client, user):
    # With a native session the page has both sections; each table sits under its heading.
    task = long_task(owner=user, rounds=2)
    pending = next_turn_to_dispatch(task=task)
    NativeSession.objects.create(
        task=task,
        bot=pending.bot,
        executor=pending.executor,
        session_id="session-1",
        worker_id="w-1",
        seen_through_message_id=2,
    )
    page = admin_client.get(PREVIEW_URL, {"task": task.pk}).content.decode()
    headings = re.findall(r"<h2>([^<]*)</h2>\s*<(\w+)(?: id=\"([^\"]*)\")?", page)
    assert headings[-2:] == [
        ("Native session", "table", "preview-session"),
        ("History turns", "table", "history-turns"),
    ]


def test_preview_escapes_the_prompt(admin_client, user):
    task = converse(
        owner=user, exchanges=[("<script>alert(1)</script> & co", "ok")], follow_up="Then?"
    )
    page = admin_client.get(PREVIEW_URL, {"task": task.pk}).content.decode()
    assert "<script>alert(1)</script>" not in page
    assert "&lt;script&gt;alert(1)&lt;/script&gt; &amp; co" in page
    assert "<script>alert(1)</script> & co" in shown_prompt(page)


def test_preview_is_prefilled_from_the_task_and_policy_links(admin_client, user):
    task = converse(owner=user, exchanges=[("Hi", "Hello")], follow_up="Bye")
    chat = HistoryPolicy.objects.get(task_type="chat")
    response = admin_client.get(PREVIEW_URL, {"policy": chat.pk})
    assert response.status_code == 200
    assert response.context["values_form"]["max_messages"].value() == 12
    assert response.context["preview"] is None
    response = admin_client.get(PREVIEW_URL, {"task": task.pk, "policy": chat.pk})
    preview = response.context["preview"]
    assert preview.policy_label == "chat v1"
    assert response.context["values_form"]["max_chars"].value() == 20_000


def test_preview_of_unsaved_values_marks_omitted_and_truncated_turns(admin_client, user):
    task = converse(
        owner=user,
        exchanges=[("First?", "x" * 300), ("Second?", "Two."), ("Third?", "Three.")],
        follow_up="Fourth?",
    )
    code = HistoryPolicy.objects.get(task_type="code")
    values = {**row_values(code), "max_messages": 3, "per_message_max_chars": 100}
    before = data_snapshot()
    response = admin_client.get(
        PREVIEW_URL, {"task": task.pk, "policy": "unsaved", **form_data(values)}
    )
    assert response.status_code == 200
    page = response.content.decode()
    prompt = shown_prompt(page)
    assert "unsaved edit (based on code v1)" in page
    # Pinned first question + the two newest turns; three turns dropped, and the notice
    # points to the whole conversation (the preview stores nothing: see data_snapshot).
    assert prompt.startswith(
        "## Conversation History\n\n[omitted earlier messages: 3 (1 user, 2 assistant)]\n[artifact "
    )
    assert (
        f"full text: .baton/history/task-{task.pk}.md]\n{history_files_note()}\n\nUser:\nFirst?"
        in prompt
    )
    assert prompt.count("User:\n") == 3  # pinned first, newest history, current
    assert "chars truncated…" not in prompt  # the long answer was dropped, not cut
    assert 'class="turn mark-included" data-message-id="1"' in page
    assert 'class="turn mark-omitted" data-message-id="2"' in page
    assert 'class="turn mark-included" data-message-id="6"' in page
    assert data_snapshot() == before

    values["max_messages"] = 20
    response = admin_client.get(
        PREVIEW_URL, {"task": task.pk, "policy": "unsaved", **form_data(values)}
    )
    page = response.content.decode()
    [cut] = response.context["preview"].report.truncated
    assert (cut.message_id, cut.original_chars) == (2, 300)
    assert 'class="turn mark-truncated" data-message-id="2"' in page
    assert f"message 2: {cut.removed_chars} of 300 chars removed" in page
    assert f"…{cut.removed_chars} chars truncated…" in shown_prompt(page)
    assert data_snapshot() == before


def test_preview_of_a_pipeline_step_shows_the_previous_result(admin_client, user):
    task = create_task(
        owner=user,
        title="Review",
        task_type="code",
        message="Add retries.",
        pipeline=[
            PipelineStep(bot="coder", executor="codex"),
            PipelineStep(bot="reviewer", executor="claude_code"),
        ],
    )
    coder = task.subtasks.get(bot="coder")
    record_result(subtask=coder, status="COMPLETED", result={"value": "patched"})
    response = admin_client.get(PREVIEW_URL, {"task": task.pk})
    preview = response.context["preview"]
    assert preview.subtask.bot == "reviewer"
    assert shown_prompt(response.content.decode()).endswith(
        "## Previous Result\n\nAssistant[coder]:\npatched\n"
    )
    assert [segment.name for segment in preview.budget] == ["current", "previous_result"]
    assert 'class="segment segment-previous_result"' in response.content.decode()


def test_preview_query_count_does_not_grow_with_the_history(
    admin_client, user, django_assert_num_queries
):
    # Both leave history out under the default policy (20 messages): the transcript they point
    # to costs one query, however long the history.
    short = long_task(owner=user, rounds=11)
    long = long_task(owner=user, rounds=30)
    admin_client.get(PREVIEW_URL, {"task": short.pk})  # warm the session and caches
    with CaptureQueriesContext(connection) as short_queries:
        admin_client.get(PREVIEW_URL, {"task": short.pk})
    with django_assert_num_queries(len(short_queries.captured_queries)):
        response = admin_client.get(PREVIEW_URL, {"task": long.pk})
    assert response.context["preview"].report.messages_omitted > 0


def test_preview_lists_a_bounded_number_of_history_turns(admin_client, user, monkeypatch):
    monkeypatch.setattr("backend.dispatch.preview.HISTORY_LIST_LIMIT", 3)
    task = long_task(owner=user, rounds=4)  # 8 history turns
    values = {**row_values(HistoryPolicy.objects.get(task_type="code")), "max_messages": 3}
    response = admin_client.get(
        PREVIEW_URL, {"task": task.pk, "policy": "unsaved", **form_data(values)}
    )
    preview = response.context["preview"]
    # The three newest, then the pinned first question (included although older).
    assert [turn.message_id for turn in preview.history_turns] == [8, 7, 6, 1]
    assert preview.history_turns_not_listed == 4
    assert "4 older turns not listed." in response.content.decode()


def test_preview_with_max_tokens_shows_the_unused_budget(admin_client, user):
    task = converse(owner=user, exchanges=[("What is 2+2?", "4")], follow_up="And 3+3?")
    values = {**row_values(HistoryPolicy.objects.get(task_type="code")), "max_tokens": 2048}
    response = admin_client.get(
        PREVIEW_URL, {"task": task.pk, "policy": "unsaved", **form_data(values)}
    )
    preview = response.context["preview"]
    unused = next(segment for segment in preview.budget if segment.name == "unused")
    assert unused.tokens == 2048 - preview.report.tokens
    assert sum(segment.tokens for segment in preview.budget) == 2048
    assert f'class="segment segment-unused" style="width: {unused.width_css}"' in (
        response.content.decode()
    )


@pytest.mark.parametrize(
    ("changes", "field", "reason"),
    [
        ({"max_tokens": 10}, "max_tokens", "must be at least 1024"),
        ({"max_chars": -5}, "max_chars", "greater than or equal to 0"),
        (
            {"per_message_max_chars": 50_000},
            "per_message_max_chars",
            "per_message_max_chars must not exceed",
        ),
    ],
)
def test_preview_shows_why_edited_values_are_invalid(admin_client, user, changes, field, reason):
    task = converse(owner=user, exchanges=[("Hi", "Hello")], follow_up="Bye")
    values = {**row_values(HistoryPolicy.objects.get(task_type="code")), **changes}
    before = data_snapshot()
    response = admin_client.get(
        PREVIEW_URL, {"task": task.pk, "policy": "unsaved", **form_data(values)}
    )
    assert response.status_code == 200
    assert response.context["preview"] is None
    form = response.context["values_form"]
    errors = form.errors[field] if field else form.non_field_errors()
    assert any(reason in error for error in errors), form.errors
    page = response.content.decode()
    assert 'id="prompt-text"' not in page
    if field:
        # Next to its field.
        assert re.search(
            rf'field-{field} errors">\s*<ul class="errorlist"[^>]*><li>[^<]*{re.escape(reason)}',
            page,
        )
    assert data_snapshot() == before


def test_preview_of_a_first_turn_is_the_message_verbatim(admin_client, user):
    task = create_task(
        owner=user,
        title="New",
        task_type="chat",
        message="Only this.",
        pipeline=[PipelineStep(executor="codex")],
    )
    page = admin_client.get(PREVIEW_URL, {"task": task.pk}).content.decode()
    assert shown_prompt(page) == "Only this."
    assert "none (the user's message verbatim)" in page
    assert "This turn has no earlier turns." in page


def test_preview_reports_unknown_tasks_and_tasks_without_turns(admin_client, user):
    response = admin_client.get(PREVIEW_URL, {"task": 999_999})
    assert response.status_code == 200
    assert "No task with this id." in response.content.decode()
    task = Task.objects.create(owner=user, title="Empty", task_type="code")
    response = admin_client.get(PREVIEW_URL, {"task": task.pk})
    assert "has no assistant turn to preview" in response.content.decode()


def test_preview_never_changes_data(admin_client, user, worker):
    task = long_task(owner=user)
    code = HistoryPolicy.objects.get(task_type="code")
    before = data_snapshot()
    pending = next_turn_to_dispatch(task=task)
    assert pending.status == SubtaskStatus.PENDING
    queries = [
        {},
        {"task": task.pk},
        {"task": task.pk, "policy": code.pk},
        {
            "task": task.pk,
            "policy": "unsaved",
            **form_data({**row_values(code), "max_messages": 1}),
        },
        {"task": task.pk, "policy": "unsaved", **form_data({**row_values(code), "max_tokens": 1})},
    ]
    for query in queries:
        assert admin_client.get(PREVIEW_URL, query).status_code == 200
    # The page is a GET form; anything else is refused before it could write.
    response = admin_client.post(f"{PREVIEW_URL}?task={task.pk}", {"max_messages": "1"})
    assert response.status_code == 405
    assert data_snapshot() == before
    pending.refresh_from_db()
    assert (pending.status, pending.attempts, pending.lease_owner) == ("PENDING", 0, "")
    # And the turn is still there for a worker to claim.
    [claimed] = claim_turns(worker=worker, worker_id="w-1", kinds=["codex"], limit=1)
    assert claimed.subtask.pk == pending.pk


def test_preview_is_staff_only(client, user, staff_user):
    login = "/admin/login/"
    response = client.get(PREVIEW_URL)
    assert response.status_code == 302
    assert response["Location"].startswith(login)
    client.force_login(user)  # not staff
    response = client.get(PREVIEW_URL, {"task": 1})
    assert response.status_code == 302
    assert response["Location"].startswith(login)
    # Staff need the right to view tasks and policies: the page shows task content.
    staff_user.user_permissions.clear()  # the fixture's operator holds them
    client.force_login(staff_user)
    assert client.get(PREVIEW_URL).status_code == 403
    staff_user.user_permissions.add(
        Permission.objects.get(codename="view_historypolicy"),
        Permission.objects.get(codename="view_task"),
    )
    assert client.get(PREVIEW_URL).status_code == 200


def test_policy_fields_are_all_on_the_preview_form(admin_client):
    page = admin_client.get(PREVIEW_URL).content.decode()
    for name in POLICY_FIELDS:
        assert f'name="{name}"' in page


# --- the live preview: the draft endpoint ------------------------------------------------------


def draft_fields(task: Task, **changes: Any) -> dict[str, Any]:
    """The preview form as the page's script posts it: the task, "unsaved" and every value."""
    values = {**row_values(HistoryPolicy.objects.get(task_type="code")), **changes}
    return {"task": task.pk, "policy": "unsaved", **form_data(values)}


def test_a_draft_is_previewed_with_what_it_changes_and_nothing_is_saved(admin_client, user):
    task = long_task(owner=user, rounds=6)
    before = data_snapshot()
    response = admin_client.post(DRAFT_URL, draft_fields(task, max_messages=3))
    assert response.status_code == 200
    answer = response.json()
    assert answer["policy"] == "unsaved edit (based on code v1)"
    assert answer["changed"] == [{"field": "max_messages", "saved": 20, "draft": 3}]
    assert answer["values"]["max_messages"] == 3
    assert answer["messages_included"] == 3  # the pinned first question and the two newest
    # The section the page shows, for the draft: its prompt, report, budget bar and changes.
    section = answer["html"]
    prompt = shown_prompt(section)
    assert prompt.startswith("## Conversation History\n\n[omitted earlier messages: 9 (4 user, ")
    assert "9 omitted (4 user, 5 assistant)" in section
    assert 'id="budget-bar"' in section and "segment-history" in section
    assert re.search(
        r'<tr data-field="max_messages"><td>max_messages</td><td>20</td><td>3</td></tr>', section
    )
    assert "<th>Saved (code v1)</th>" in section
    assert "<html" not in section  # a section, not a page
    assert data_snapshot() == before

    # The values the task type resolves to change nothing, and the section says so.
    answer = admin_client.post(DRAFT_URL, draft_fields(task)).json()
    assert answer["changed"] == []
    assert "nothing changed" in answer["html"]
    assert answer["messages_included"] == 12
    assert data_snapshot() == before


def test_the_button_path_shows_the_draft_changes_too(admin_client, user):
    task = long_task(owner=user, rounds=2)
    response = admin_client.get(
        PREVIEW_URL, {**draft_fields(task, max_chars=5000, keep_first_user_message=False)}
    )
    changes = response.context["preview"].changes
    assert [(c.field, c.saved, c.draft) for c in changes] == [
        ("max_chars", 40_000, 5000),
        ("keep_first_user_message", True, False),
    ]
    assert 'id="preview-changes"' in response.content.decode()


def test_a_saved_policy_previewed_live_fills_the_form_and_changes_nothing(admin_client, user):
    task = long_task(owner=user, rounds=2)
    chat = HistoryPolicy.objects.get(task_type="chat")
    answer = admin_client.post(DRAFT_URL, {"task": task.pk, "policy": chat.pk}).json()
    assert answer["policy"] == "chat v1"
    assert answer["changed"] == []
    assert (answer["values"]["max_messages"], answer["values"]["max_chars"]) == (12, 20_000)
    assert "Draft changes" not in answer["html"]


@pytest.mark.parametrize(
    ("fields", "field", "reason"),
    [
        ({"max_chars": "-5"}, "max_chars", "greater than or equal to 0"),
        ({"max_tokens": "10"}, "max_tokens", "must be at least 1024"),
        ({"max_messages": "many"}, "max_messages", "Enter a whole number."),
        ({"task": ""}, "task", "This field is required."),
        ({"task": "999999"}, "task", "No task with this id."),
    ],
)
def test_a_refused_draft_is_a_400_naming_the_field(admin_client, user, fields, field, reason):
    task = long_task(owner=user, rounds=1)
    before = data_snapshot()
    response = admin_client.post(DRAFT_URL, {**draft_fields(task), **fields})
    assert response.status_code == 400
    errors = response.json()["errors"]
    assert list(errors) == [field]
    assert any(reason in message for message in errors[field]), errors
    assert data_snapshot() == before


def test_the_draft_endpoint_honours_the_admin_permissions_and_csrf(client, user, staff_user):
    task = long_task(owner=user, rounds=1)
    fields = draft_fields(task, max_messages=1)
    response = client.post(DRAFT_URL, fields)  # not logged in
    assert response.status_code == 302
    assert response["Location"].startswith("/admin/login/")
    client.force_login(user)  # not staff
    assert client.post(DRAFT_URL, fields).status_code == 302
    staff_user.user_permissions.clear()
    client.force_login(staff_user)
    assert client.post(DRAFT_URL, fields).status_code == 403
    staff_user.user_permissions.add(Permission.objects.get(codename="view_historypolicy"))
    assert client.post(DRAFT_URL, fields).status_code == 403  # tasks too: it shows their text
    staff_user.user_permissions.add(Permission.objects.get(codename="view_task"))
    assert client.post(DRAFT_URL, fields).status_code == 200
    assert client.get(DRAFT_URL, fields).status_code == 405

    # The admin's CSRF check: without the page's token the post is refused.
    browser = Client(enforce_csrf_checks=True)
    browser.force_login(staff_user)
    assert browser.post(DRAFT_URL, fields).status_code == 403
    page = browser.get(PREVIEW_URL).content.decode()
    token = re.search(r'data-csrf-token="([^"]+)"', page).group(1)
    response = browser.post(DRAFT_URL, fields, headers={"X-CSRFToken": token})
    assert response.status_code == 200
    assert response.json()["messages_included"] == 1


def test_turn_pages_show_bounded_text_and_the_result_as_sent(admin_client, user, settings):
    from backend.tasks.models import Subtask

    settings.BATON_SPILL_THRESHOLD_CHARS = 1_000
    settings.BATON_PREVIEW_HEAD_CHARS = settings.BATON_PREVIEW_TAIL_CHARS = 100
    value = "START " + "x" * 5_000 + " END"
    task = answered_task(owner=user, title="big", message="go", answer=value)
    turn = task.subtasks.get(role="ASSISTANT")
    page = admin_client.get(f"/admin/tasks/task/{task.pk}/change/").content.decode()
    assert "chars truncated" in page
    assert "x" * 1_000 not in page  # the task page lists turns, bounded
    detail = admin_client.get(f"/admin/tasks/subtask/{turn.pk}/change/").content.decode()
    assert value in detail  # the result as sent, not {"value": null}
    assert Subtask.objects.get(pk=turn.pk).result == {"value": None}


def test_turn_pages_mark_a_damaged_value_and_stay_up(
    admin_client, user, settings, artifact_storage_in_tmp
):
    settings.BATON_SPILL_THRESHOLD_CHARS = 1_000
    settings.BATON_PREVIEW_HEAD_CHARS = settings.BATON_PREVIEW_TAIL_CHARS = 100
    task = answered_task(owner=user, title="big", message="go", answer="y" * 5_000)
    turn = task.subtasks.select_related("artifact").get(role="ASSISTANT")
    assert turn.artifact is not None
    (artifact_storage_in_tmp / turn.artifact.storage_key).unlink()
    detail = admin_client.get(f"/admin/tasks/subtask/{turn.pk}/change/")
    assert detail.status_code == 200
    assert f"(damaged) artifact {turn.artifact.id}: content is missing" in detail.content.decode()
    assert admin_client.get(f"/admin/tasks/task/{task.pk}/change/").status_code == 200


def task_change_data(admin_client, task: Task, **changes: Any) -> dict[str, Any]:
    """The task change form as a browser posts it: the page's hidden inline management fields,
    the task's own fields, then `changes`."""
    page = admin_client.get(f"/admin/tasks/task/{task.pk}/change/").content.decode()
    hidden = {
        html.unescape(name): html.unescape(value)
        for name, value in re.findall(r'<input type="hidden" name="([^"]+)" value="([^"]*)"', page)
        if name != "csrfmiddlewaretoken"
    }
    return {
        **hidden,
        "owner": task.owner_id,
        "title": task.title,
        "task_type": task.task_type,
        "status": task.status,
        "pipeline": json.dumps(task.pipeline),
        **({"is_group_chat": "on"} if task.is_group_chat else {}),
        **changes,
        "_save": "Save",
    }


def test_a_pipeline_edited_in_the_admin_is_bounded_and_checked(admin_client, user, settings):
    settings.BATON_MAX_PIPELINE_STEPS = 3
    task = answered_task(owner=user)
    url = f"/admin/tasks/task/{task.pk}/change/"
    stored = task.pipeline
    step = {"bot": "coder", "executor": "codex", "context_passing": None}
    for pipeline, reason in [
        ([step] * 4, "pipeline has 4 steps; at most 3 are allowed."),
        ([{"bot": "ghost"}], "bot 'ghost' is not registered"),
        ([{"bot": "coder", "model": "x"}], "The pipeline is a list of steps"),
        ({"bot": "coder"}, "The pipeline is a list of steps"),
    ]:
        data = task_change_data(admin_client, task, pipeline=json.dumps(pipeline))
        response = admin_client.post(url, data)
        assert response.status_code == 200, pipeline
        errors = response.context["adminform"].form.errors["pipeline"]
        assert any(reason in error for error in errors), errors
        task.refresh_from_db()
        assert task.pipeline == stored
    # Within the limit: stored as create_task stores it (the bot's executor filled in).
    data = task_change_data(admin_client, task, pipeline=json.dumps([{"bot": "reviewer"}] * 3))
    assert admin_client.post(url, data).status_code == 302
    task.refresh_from_db()
    assert (
        task.pipeline
        == [{"bot": "reviewer", "executor": "claude_code", "context_passing": None}] * 3
    )
    # A pipeline stored before the limit was lowered does not block other edits.
    settings.BATON_MAX_PIPELINE_STEPS = 1
    data = task_change_data(admin_client, task, title="Renamed")
    assert admin_client.post(url, data).status_code == 302
    task.refresh_from_db()
    assert (task.title, len(task.pipeline)) == ("Renamed", 3)


def test_bots_are_registered_and_edited_in_the_admin(client, staff_user, api):
    from backend.tasks.models import Bot

    staff_user.is_superuser = True
    staff_user.save()
    client.force_login(staff_user)
    listing = client.get("/admin/tasks/bot/")
    assert listing.status_code == 200
    assert b"claude-code" in listing.content
    response = client.post(
        "/admin/tasks/bot/add/",
        {
            "name": "triager",
            "executor": "agno",
            "model": "gpt-5.5",
            "instructions": "Label the issue.",
            "permission_mode": "read_only",
            "timeout_seconds": 120,
            "max_turns": 4,
        },
    )
    assert response.status_code == 302, response.content
    bot = Bot.objects.get(name="triager")
    assert (bot.executor, bot.permission_mode, bot.max_turns) == ("agno", "read_only", 4)
    # A product can now name it.
    created = api.post(
        "/api/tasks/",
        {"title": "t", "task_type": "chat", "message": "hi", "bot": "triager"},
        format="json",
    )
    assert created.status_code == 201, created.json()
    # A bot that turns name cannot be deleted or renamed.
    page = client.get(f"/admin/tasks/bot/{bot.pk}/change/")
    assert b'name="name"' not in page.content
    assert client.get(f"/admin/tasks/bot/{bot.pk}/delete/").status_code == 403
    # A name that cannot sit in a role label is refused.
    bad = client.post(
        "/admin/tasks/bot/add/",
        {
            "name": "a[b]",
            "executor": "codex",
            "permission_mode": "full_access",
            "timeout_seconds": 1,
        },
    )
    assert bad.status_code == 200
    assert b"square brackets" in bad.content


def test_the_change_page_shows_where_each_value_comes_from_and_can_inherit_again(
    admin_client, settings
):
    settings.EXECUTOR_HISTORY_DEFAULTS = {**settings.EXECUTOR_HISTORY_DEFAULTS, "max_messages": 2}
    settings.EXECUTOR_HISTORY_FROM_ENVIRONMENT = frozenset({"max_messages"})
    chat = HistoryPolicy.objects.get(task_type="chat")
    url = f"/admin/dispatch/historypolicy/{chat.pk}/change/"
    page = html.unescape(admin_client.get(url).content.decode())
    assert "<tr><td>max_messages</td><td>12</td><td>task_type</td></tr>" in page
    assert "<tr><td>per_message_max_chars</td><td>4000</td><td>built-in</td></tr>" in page
    code = HistoryPolicy.objects.get(task_type="code")
    code_page = admin_client.get(f"/admin/dispatch/historypolicy/{code.pk}/change/")
    assert "<tr><td>max_messages</td><td>2</td><td>environment</td></tr>" in html.unescape(
        code_page.content.decode()
    )
    # Unticking a field the row sets makes it inherit again (here: from the environment).
    data = {**change_data(chat), "set_here": ["max_chars"]}
    assert admin_client.post(url, data).status_code == 302
    chat.refresh_from_db()
    assert (chat.overrides, chat.version) == (["max_chars"], 2)
    assert resolve_policy(task_type="chat").policy.max_messages == 2


def test_a_prompt_report_follows_its_tasks_permission(client, dispatched):
    """The report's page replays the prompt (the user's text): staff holding only the report's
    view permission see no report, as the API answers them 404; with the task's view
    permission too, they see it and its replay."""
    operator = User.objects.create_user(username="reports-only", password="x", is_staff=True)
    operator.user_permissions.add(
        Permission.objects.get(content_type__app_label="dispatch", codename="view_promptreport")
    )
    client.force_login(operator)
    page_url = f"/admin/dispatch/promptreport/{dispatched.pk}/change/"
    assert client.get(page_url).status_code == 302  # the admin's answer for a row it hides
    listing = client.get("/admin/dispatch/promptreport/")
    assert listing.status_code == 200
    assert page_url not in listing.content.decode()
    assert client.get(f"/api/prompt-reports/{dispatched.pk}/").status_code == 404

    operator.user_permissions.add(
        Permission.objects.get(content_type__app_label="tasks", codename="view_task")
    )
    operator = User.objects.get(pk=operator.pk)  # a fresh permission cache
    client.force_login(operator)
    page = client.get(page_url)
    assert page.status_code == 200
    assert "And 3+3?" in page.content.decode()
    assert page_url in client.get("/admin/dispatch/promptreport/").content.decode()
    assert client.get(f"/api/prompt-reports/{dispatched.pk}/").status_code == 200
