"""A task's admin page shows a dispatch as one entry with the prompts it built: a resumed
dispatch (a resume prompt and a full prompt, two reports of one claim) is one dispatch, in the
task's list and beside its turn."""

from __future__ import annotations

import re

import pytest
from django.urls import reverse

from backend.dispatch.admin_inlines import dispatches_of
from backend.dispatch.models import PromptReport
from tests.api.test_prompt_reports_api import resumed_dispatch
from tests.dispatch.test_dispatch_api import create, dispatch
from tests.tasks.test_admin_conversation import turn_block

pytestmark = [pytest.mark.django_db, pytest.mark.usefixtures("pipeline_bots")]


def task_page(admin_client, task_id: int) -> str:
    response = admin_client.get(f"/admin/tasks/task/{task_id}/change/")
    assert response.status_code == 200
    return response.content.decode()


def section(page: str, pattern: str) -> str:
    match = re.search(pattern, page, re.DOTALL)
    assert match, pattern
    return match.group(0)


def test_a_resumed_dispatch_is_one_dispatch_with_its_two_prompts(api, worker_api, admin_client):
    task, coder = resumed_dispatch(api, worker_api)
    full, resume = (
        PromptReport.objects.get(subtask_id=coder["subtask_id"], kind=kind)
        for kind in ("full", "resume")
    )
    page = task_page(admin_client, task["id"])

    listed = section(
        page, r'<div class="js-inline-admin-formset inline-group" id="dispatches".*?</table>'
    )
    # Three dispatches (the coder twice, the reviewer once), four prompts.
    assert "Dispatches and their prompts (3 dispatches, 4 prompts)" in listed
    assert listed.count('<tr class="dispatch">') == 3
    created = min(full.created_at, resume.created_at).strftime("%Y-%m-%d %H:%M:%S")
    # The newest dispatch comes first: the coder's second turn, its two prompts under it.
    first = listed.split('<tr class="dispatch">')[1]
    assert first.startswith(
        f'<td colspan="9"><strong>message {coder["message_id"]}</strong> · attempt 1 · '
        f"worker w1 · 2 prompts · {created}</td></tr>"
    )
    for report in (full, resume):
        url = reverse("admin:dispatch_promptreport_change", args=[report.pk])
        assert (
            f'<tr class="prompt kind-{report.kind}"><td><a href="{url}">prompt report '
            f"{report.pk}</a></td><td>{report.kind} prompt offered</td>"
        ) in first

    beside = turn_block(page, coder["message_id"])
    assert beside.count('<div class="dispatch">') == 1
    assert '<div class="dispatch-line">attempt 1 · worker w1 · 2 prompts</div>' in beside
    assert beside.count('<div class="sent-prompt kind-') == 2


def test_dispatches_are_told_apart_by_turn_attempt_and_worker(api, worker_api):
    create(api)
    [turn] = dispatch(worker_api)
    row = PromptReport.objects.get(subtask_id=turn["subtask_id"])
    again = PromptReport.objects.get(pk=row.pk)
    again.pk, again.kind = None, "resume"
    again.save()
    other_attempt = PromptReport.objects.get(pk=row.pk)
    other_attempt.pk, other_attempt.attempt = None, 2
    other_attempt.save()
    reports = PromptReport.objects.filter(subtask_id=turn["subtask_id"]).order_by("id")
    assert [(d.attempt, [r.pk for r in d.reports]) for d in dispatches_of(reports)] == [
        (1, [row.pk, again.pk]),
        (2, [other_attempt.pk]),
    ]
