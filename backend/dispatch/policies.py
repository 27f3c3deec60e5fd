"""History policy resolution and changes.

Resolution for a task type: its own `HistoryPolicy` row → the default row (empty task type) →
the EXECUTOR_HISTORY_* settings. Rows are read at every dispatch, so a change applies to the
next dispatch without a restart. EXECUTOR_HISTORY_ENABLED=false is the global kill switch: it
turns history off whatever the rows say.

Every row is validated by the prompt builder's own pydantic `HistoryPolicy`, so the admin, the
API and the builder agree on what is valid.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from django.conf import settings
from django.contrib.auth.models import AbstractBaseUser
from django.db import transaction
from django.db.models import F
from pydantic import ValidationError

from backend.dispatch.models import DEFAULT_TASK_TYPE, HistoryPolicy
from backend.errors import InvalidInput
from backend.prompting.policy import HistoryPolicy as BuilderPolicy

# The HistoryPolicy columns that are builder caps (everything an operator tunes).
POLICY_FIELDS = (
    "enabled",
    "max_messages",
    "max_chars",
    "per_message_max_chars",
    "max_tokens",
    "token_encoding",
    "keep_first_user_message",
    "previous_result_max_chars",
    "current_message_max_chars",
    "context_passing",
    "resume_native_sessions",
    "resume_max_context_fraction",
)


@dataclass(frozen=True)
class ResolvedPolicy:
    """The policy a dispatch uses and where it came from."""

    policy: BuilderPolicy
    row: HistoryPolicy | None
    source: str  # "row" or "settings"

    @property
    def row_id(self) -> int | None:
        return self.row.pk if self.row is not None else None

    @property
    def version(self) -> int | None:
        return self.row.version if self.row is not None else None

    @property
    def label(self) -> str:
        if self.row is None:
            return "settings"
        return f"{self.row.task_type or 'default'} v{self.row.version}"


def builder_policy(values: Mapping[str, Any]) -> BuilderPolicy:
    """Validate cap values as the builder's policy (ingestion sizes come from settings).

    Raises InvalidInput naming the first offending field, with pydantic's reason.
    """
    data = {name: values[name] for name in POLICY_FIELDS if name in values}
    data.update(
        spill_threshold_chars=settings.BATON_SPILL_THRESHOLD_CHARS,
        preview_head_chars=settings.BATON_PREVIEW_HEAD_CHARS,
        preview_tail_chars=settings.BATON_PREVIEW_TAIL_CHARS,
    )
    try:
        return BuilderPolicy.model_validate(data)
    except ValidationError as error:
        first = error.errors()[0]
        reason = first["msg"].removeprefix("Value error, ")
        field = ".".join(str(part) for part in first["loc"]) or None
        if field is None:
            # A rule across fields: name the field the reason starts with.
            field = next((name for name in POLICY_FIELDS if reason.startswith(name)), None)
        message = f"{field}: {reason}" if field else reason
        raise InvalidInput(message, field=field or "policy") from None


def row_values(row: HistoryPolicy) -> dict[str, Any]:
    return {name: getattr(row, name) for name in POLICY_FIELDS}


def settings_policy() -> BuilderPolicy:
    return builder_policy({"enabled": True, **settings.EXECUTOR_HISTORY_DEFAULTS})


def _apply_kill_switch(policy: BuilderPolicy) -> BuilderPolicy:
    if settings.EXECUTOR_HISTORY_ENABLED:
        return policy
    return policy.model_copy(update={"enabled": False})


def resolve_from_rows(*, task_type: str, rows: Mapping[str, HistoryPolicy]) -> ResolvedPolicy:
    """Resolve with rows already fetched (keyed by task type), for batch dispatch."""
    row = rows.get(task_type) or rows.get(DEFAULT_TASK_TYPE)
    if row is None:
        return ResolvedPolicy(
            policy=_apply_kill_switch(settings_policy()), row=None, source="settings"
        )
    return ResolvedPolicy(
        policy=_apply_kill_switch(builder_policy(row_values(row))), row=row, source="row"
    )


def policy_rows(*, task_types: set[str]) -> dict[str, HistoryPolicy]:
    """The rows that can apply to these task types (one query)."""
    wanted = set(task_types) | {DEFAULT_TASK_TYPE}
    return {row.task_type: row for row in HistoryPolicy.objects.filter(task_type__in=wanted)}


def resolve_policy(*, task_type: str) -> ResolvedPolicy:
    return resolve_from_rows(task_type=task_type, rows=policy_rows(task_types={task_type}))


def save_policy(
    *, row: HistoryPolicy, changed_by: AbstractBaseUser | None, values: Mapping[str, Any]
) -> HistoryPolicy:
    """Validate and store new cap values; the version goes up by one on every change."""
    merged = {**row_values(row), **{k: v for k, v in values.items() if k in POLICY_FIELDS}}
    builder_policy(merged)
    with transaction.atomic():
        for name, value in merged.items():
            setattr(row, name, value)
        row.updated_by = changed_by
        if row.pk is None:
            row.version = 1
            row.save()
        else:
            row.version = F("version") + 1
            row.save()
            row.refresh_from_db(fields=["version"])
    return row
