"""The admin's prompt preview: the page, and the live preview that follows an operator's draft.

The page (`preview/` under the history policy admin) is a GET form: a task, a policy (the one
dispatch resolves, a saved row, or the edited values below it) and every cap value. Its button
loads the page with the prompt the next dispatch of that task would send, and works without
JavaScript.

With JavaScript, `dispatch/prompt_preview.js` keeps the prompt in step with the form: as the
operator edits a value (the draft), it posts the same fields to `preview/draft/`, debounced, and
puts the answer in place of the preview section without reloading the page. That endpoint parses
with the same forms as the page, so a value the page would refuse is a 400 naming the field; it
answers the section's HTML (the same template the page includes, so both show the same thing),
the values the draft changes against the saved policy, and the values previewed. It is a POST so
that the admin's CSRF check covers it as it covers every admin form; like the page, it only reads
(`backend.dispatch.preview`): nothing is claimed, recorded or saved.

Both need the right to view policies (a change right includes it) and tasks: the preview shows
task content.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from django import forms
from django.contrib import admin
from django.core.exceptions import PermissionDenied
from django.http import (
    HttpRequest,
    HttpResponse,
    HttpResponseNotAllowed,
    JsonResponse,
    QueryDict,
)
from django.template.loader import render_to_string
from django.template.response import TemplateResponse
from django.urls import URLPattern, path

from backend.dispatch.models import HistoryPolicy
from backend.dispatch.policies import POLICY_FIELDS, builder_policy, check_summary_bot
from backend.dispatch.preview import PromptPreview, preview_prompt
from backend.errors import BatonError, InvalidInput
from backend.tasks.models import Task

if TYPE_CHECKING:
    _PreviewAdminBase = admin.ModelAdmin[HistoryPolicy]
else:
    _PreviewAdminBase = object

PREVIEW_URL_NAME = "dispatch_historypolicy_preview"
DRAFT_PREVIEW_URL_NAME = "dispatch_historypolicy_draft_preview"
RESULT_TEMPLATE = "admin/dispatch/prompt_preview_result.html"

# The preview's policy choices besides the saved rows.
RESOLVED_CHOICE = ""
UNSAVED_CHOICE = "unsaved"


def attach_policy_error(form: forms.BaseForm, error: InvalidInput) -> None:
    """Put a policy validation reason next to the field it names, or above the form."""
    if error.field in form.fields:
        form.add_error(error.field, error.message.removeprefix(f"{error.field}: "))
    else:
        form.add_error(None, error.message)


class PolicyValuesForm(forms.ModelForm[HistoryPolicy]):
    """The cap fields of a policy, validated together as the prompt builder validates them."""

    class Meta:
        model = HistoryPolicy
        fields = list(POLICY_FIELDS)

    def clean(self) -> dict[str, Any]:
        super().clean()
        cleaned = self.cleaned_data
        # A field that failed its own validation has already said why; combining the rest
        # would only repeat or guess.
        if not self.errors:
            try:
                check_summary_bot(
                    builder_policy({name: cleaned.get(name) for name in POLICY_FIELDS})
                )
            except InvalidInput as error:
                attach_policy_error(self, error)
        return cleaned

    def policy_values(self) -> dict[str, Any]:
        return {name: self.cleaned_data[name] for name in POLICY_FIELDS}


class PreviewForm(forms.Form):
    """Which task and which policy to preview (the cap values are a `PolicyValuesForm`)."""

    task = forms.IntegerField(
        min_value=1, label="Task id", help_text="The task whose next dispatch to preview."
    )
    policy = forms.ChoiceField(
        required=False,
        help_text=(
            "A saved policy row, the one dispatch would resolve for the task's type, or the "
            "edited values below (not saved)."
        ),
    )

    def __init__(self, *args: Any, rows: list[HistoryPolicy], **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        policy = self.fields["policy"]
        assert isinstance(policy, forms.ChoiceField)
        policy.choices = [
            (RESOLVED_CHOICE, "As dispatch resolves it for the task's type"),
            *((str(row.pk), f"Saved: {row}") for row in rows),
            (UNSAVED_CHOICE, "Edited values below (unsaved)"),
        ]


@dataclass
class PreviewRequest:
    """The preview form as submitted, and the preview it asks for when it is valid."""

    selector: PreviewForm
    values_form: PolicyValuesForm
    preview: PromptPreview | None

    def field_errors(self) -> dict[str, list[str]]:
        """Every reason the preview was not built, by field (`__all__`: not one field's)."""
        errors: dict[str, list[str]] = {}
        for form in (self.selector, self.values_form):
            for name, messages in form.errors.get_json_data().items():
                errors.setdefault(name, []).extend(message["message"] for message in messages)
        return errors


def read_preview_request(fields: QueryDict, *, submitted: bool) -> PreviewRequest:
    """Parse the task, the policy and (for a draft) the cap values, and build the preview."""
    rows = list(HistoryPolicy.objects.all())
    selector = PreviewForm(
        fields if submitted else None,
        rows=rows,
        initial={"policy": fields.get("policy", RESOLVED_CHOICE)},
    )
    choice = selector["policy"].value() or RESOLVED_CHOICE
    chosen_row = next((row for row in rows if str(row.pk) == choice), None)
    unsaved = submitted and choice == UNSAVED_CHOICE
    values_form = PolicyValuesForm(fields if unsaved else None)
    preview: PromptPreview | None = None
    if submitted and selector.is_valid() and (not unsaved or values_form.is_valid()):
        task = Task.objects.filter(pk=selector.cleaned_data["task"]).first()
        if task is None:
            selector.add_error("task", "No task with this id.")
        else:
            values_or_row = values_form.policy_values() if unsaved else chosen_row
            try:
                preview = preview_prompt(task=task, values_or_row=values_or_row)
            except InvalidInput as error:
                attach_policy_error(values_form if unsaved else selector, error)
            except BatonError as error:
                selector.add_error(None, error.message)
    if not unsaved:
        # Pre-fill the cap fields from the policy shown, ready to be edited.
        if preview is not None:
            values_form = PolicyValuesForm(initial=preview.values)
        elif chosen_row is not None:
            values_form = PolicyValuesForm(instance=chosen_row)
    return PreviewRequest(selector=selector, values_form=values_form, preview=preview)


class PromptPreviewAdminMixin(_PreviewAdminBase):
    """The preview page and its draft endpoint, as URLs of the history policy admin."""

    def get_urls(self) -> list[URLPattern]:
        own = [
            path(
                "preview/draft/",
                self.admin_site.admin_view(self.draft_preview_view),
                name=DRAFT_PREVIEW_URL_NAME,
            ),
            path("preview/", self.admin_site.admin_view(self.preview_view), name=PREVIEW_URL_NAME),
        ]
        # Before the default patterns: their "<object_id>/" would take "preview/".
        return [*own, *super().get_urls()]

    def check_preview_permission(self, request: HttpRequest) -> None:
        # The preview shows task content, so it needs the right to view tasks as well.
        task_admin = self.admin_site.get_model_admin(Task)
        if not (self.has_view_permission(request) and task_admin.has_view_permission(request)):
            raise PermissionDenied

    def preview_view(self, request: HttpRequest) -> HttpResponse:
        """The prompt preview page: parse the form, build the preview, render."""
        if request.method not in ("GET", "HEAD"):
            return HttpResponseNotAllowed(["GET", "HEAD"])
        self.check_preview_permission(request)
        asked = read_preview_request(request.GET, submitted="task" in request.GET)
        context = {
            **self.admin_site.each_context(request),
            "opts": self.opts,
            "title": "Prompt preview",
            "selector": asked.selector,
            "values_form": asked.values_form,
            "unsaved_choice": UNSAVED_CHOICE,
            "preview": asked.preview,
        }
        return TemplateResponse(request, "admin/dispatch/prompt_preview.html", context)

    def draft_preview_view(self, request: HttpRequest) -> HttpResponse:
        """The live preview: the page's fields posted, the preview section answered as JSON."""
        if request.method != "POST":
            return HttpResponseNotAllowed(["POST"])
        self.check_preview_permission(request)
        asked = read_preview_request(request.POST, submitted=True)
        preview = asked.preview
        if preview is None:
            return JsonResponse({"errors": asked.field_errors()}, status=400)
        return JsonResponse(
            {
                "html": render_to_string(RESULT_TEMPLATE, {"preview": preview}, request=request),
                "policy": preview.policy_label,
                "changed": [
                    {"field": change.field, "saved": change.saved, "draft": change.draft}
                    for change in preview.changes
                ],
                "values": preview.values,
                "tokens": preview.report.tokens,
                "messages_included": preview.report.messages_included,
            }
        )
