"""The history policy API for operators (staff): read and change per-task-type caps, with the
model permissions the admin asks for the same (`permissions.ModelPermissions`): view (or
change) to read, change to change, add as well to create a task type's row.

The same validation as the admin: values are checked by the prompt builder's own policy and
an invalid combination is refused with the reason, naming the field. Every change bumps the
row's version and applies to the next dispatch.
"""

from __future__ import annotations

import re
from typing import Any

from drf_spectacular.utils import extend_schema, extend_schema_field
from rest_framework import serializers, status
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from backend.api.permissions import ModelPermissions, authenticated_user
from backend.api.serializers import StrictInput
from backend.dispatch.models import DEFAULT_TASK_TYPE, HistoryPolicy
from backend.dispatch.policies import (
    POLICY_FIELDS,
    SOURCE_BUILT_IN,
    SOURCE_DEFAULT_ROW,
    SOURCE_ENVIRONMENT,
    SOURCE_TASK_TYPE,
    row_effective_values,
    save_policy,
)
from backend.errors import InvalidInput, NotFound
from backend.prompting.policy import CAP_RANGE, MAX_CAP, MAX_SUMMARY_THRESHOLD_TURNS
from backend.prompting.units import ENCODINGS
from backend.tasks.models import CONTEXT_PASSING_CHOICES, TASK_TYPE_PATTERN

# How the default row (empty task type) is named in URLs.
DEFAULT_POLICY_NAME = "default"


def _task_type(name: str) -> str:
    return DEFAULT_TASK_TYPE if name == DEFAULT_POLICY_NAME else name


SOURCES = [SOURCE_TASK_TYPE, SOURCE_DEFAULT_ROW, SOURCE_ENVIRONMENT, SOURCE_BUILT_IN]


class PolicyOutput(serializers.ModelSerializer[HistoryPolicy]):
    """What dispatch uses for a row's task type, where each value comes from, and what it sets.

    Each cap is the effective value. `sources` says where it comes from: `task_type` (this row
    sets it), `default` (the default row), `environment` (an EXECUTOR_HISTORY_* variable) or
    `built-in`; `overrides` lists the fields this row sets.
    """

    name = serializers.SerializerMethodField()
    updated_by = serializers.CharField(source="updated_by.get_username", default=None)
    sources = serializers.SerializerMethodField()

    class Meta:
        model = HistoryPolicy
        fields = [
            "name",
            "task_type",
            *POLICY_FIELDS,
            "overrides",
            "sources",
            "version",
            "updated_by",
            "updated_at",
        ]
        read_only_fields = fields

    def get_name(self, row: HistoryPolicy) -> str:
        return row.task_type or DEFAULT_POLICY_NAME

    @extend_schema_field(serializers.DictField(child=serializers.ChoiceField(choices=SOURCES)))
    def get_sources(self, row: HistoryPolicy) -> dict[str, str]:
        return self._sources

    def to_representation(self, row: HistoryPolicy) -> dict[str, Any]:
        # Resolved once per row: the caps' values and, through get_sources, their sources.
        values, self._sources = row_effective_values(
            row=row, default_row=self.context.get("default_row")
        )
        data = super().to_representation(row)
        data.update(values)
        return data


def _output(rows: Any, *, many: bool = False) -> Any:
    default = HistoryPolicy.objects.filter(task_type=DEFAULT_TASK_TYPE).first()
    return PolicyOutput(rows, many=many, context={"default_row": default}).data


# The prompt builder's reason, as a sentence of its own.
CAP_OUT_OF_RANGE = f"{CAP_RANGE.capitalize()}."


def _optional_cap() -> serializers.IntegerField:
    """An integer cap: what the policy's integer column holds and the prompt builder accepts."""
    return serializers.IntegerField(
        required=False,
        allow_null=True,
        min_value=1,
        max_value=MAX_CAP,
        error_messages={"min_value": CAP_OUT_OF_RANGE, "max_value": CAP_OUT_OF_RANGE},
    )


class PolicyInput(StrictInput):
    """Any subset of the caps; omitted ones keep their value."""

    enabled = serializers.BooleanField(required=False)
    max_messages = _optional_cap()
    max_chars = _optional_cap()
    per_message_max_chars = _optional_cap()
    max_tokens = _optional_cap()
    max_tokens_fraction = serializers.FloatField(required=False, allow_null=True)
    token_encoding = serializers.ChoiceField(
        choices=ENCODINGS,
        required=False,
        help_text="A token encoding Baton bundles (nothing is downloaded at run time).",
        error_messages={
            "invalid_choice": (
                "'{input}' is not a token encoding Baton bundles; use one of "
                + ", ".join(ENCODINGS)
                + "."
            )
        },
    )
    keep_first_user_message = serializers.BooleanField(required=False)
    previous_result_max_chars = _optional_cap()
    current_message_max_chars = _optional_cap()
    context_passing = serializers.ChoiceField(choices=CONTEXT_PASSING_CHOICES, required=False)
    resume_native_sessions = serializers.BooleanField(required=False)
    resume_max_context_fraction = serializers.FloatField(required=False)
    summaries_enabled = serializers.BooleanField(required=False)
    summary_bot = serializers.CharField(
        required=False, allow_null=True, max_length=64, help_text="A registered bot's name."
    )
    summary_threshold_turns = serializers.IntegerField(
        required=False, min_value=1, max_value=MAX_SUMMARY_THRESHOLD_TURNS
    )
    summary_max_chars = _optional_cap()
    inherit = serializers.ListField(
        child=serializers.ChoiceField(choices=list(POLICY_FIELDS)),
        required=False,
        help_text="Fields this row stops setting: they are inherited again.",
    )


class PolicyListApi(APIView):
    permission_classes = [ModelPermissions]
    permission_model = HistoryPolicy

    @extend_schema(operation_id="policies_list", responses=PolicyOutput(many=True))
    def get(self, request: Request) -> Response:
        rows = HistoryPolicy.objects.select_related("updated_by").order_by("task_type")
        return Response(_output(rows, many=True))


class PolicyDetailApi(APIView):
    permission_classes = [ModelPermissions]
    permission_model = HistoryPolicy

    @extend_schema(operation_id="policies_retrieve", responses=PolicyOutput)
    def get(self, request: Request, name: str) -> Response:
        row = HistoryPolicy.objects.filter(task_type=_task_type(name)).first()
        if row is None:
            raise NotFound(f"No history policy for task type {name!r}.")
        return Response(_output(row))

    @extend_schema(
        operation_id="policies_update",
        request=PolicyInput,
        responses={200: PolicyOutput, 201: PolicyOutput},
        summary="Change a task type's caps (creates the row if the type has none)",
    )
    def patch(self, request: Request, name: str) -> Response:
        task_type = _task_type(name)
        if task_type and not re.fullmatch(TASK_TYPE_PATTERN, task_type):
            raise InvalidInput(f"{name!r} is not a valid task type.", field="task_type")
        payload = PolicyInput(data=request.data)
        payload.is_valid(raise_exception=True)
        row = HistoryPolicy.objects.filter(task_type=task_type).first()
        created = row is None
        row = row or HistoryPolicy(task_type=task_type)
        self.check_object_permissions(request, row)  # a new row needs the add permission
        values: dict[str, Any] = dict(payload.validated_data)
        inherit = values.pop("inherit", [])
        row = save_policy(
            row=row,
            changed_by=authenticated_user(request),
            values=values,
            inherit=inherit,
        )
        return Response(
            _output(row),
            status=status.HTTP_201_CREATED if created else status.HTTP_200_OK,
        )
