"""History policy resolution and changes.

Resolution is per field. A row sets only the fields in its `overrides`; every other field is
inherited. For a task type, each field comes from its own `HistoryPolicy` row if that row sets
it, else from the default row (empty task type) if that row sets it, else from the
EXECUTOR_HISTORY_* environment variable when the operator set one, else from Baton's built-in
default. The shipped rows set only what differs from the built-in defaults, so an environment
setting is never silently shadowed by a row nobody edited; `ResolvedPolicy.sources` says where
each effective value came from, and the admin and `GET /api/policies/` show it.

Rows are read at every dispatch, so a change applies to the next dispatch without a restart.
EXECUTOR_HISTORY_ENABLED=false is the global kill switch: it turns history off whatever the
rows say.

Every row is validated by the prompt builder's own pydantic `PromptPolicy`, so the admin, the
API and the builder agree on what is valid; a `summary_bot` must also name a registered bot.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from django.conf import settings
from django.contrib.auth.models import User
from django.db import transaction
from django.db.models import F
from pydantic import ValidationError

from backend.configuration_cache import CONFIGURATION
from backend.dispatch.models import DEFAULT_TASK_TYPE, HistoryPolicy
from backend.errors import InvalidInput
from backend.prompting.policy import PromptPolicy
from backend.tasks.models import Bot

# The HistoryPolicy columns that are builder caps (everything an operator tunes).
POLICY_FIELDS = (
    "enabled",
    "max_messages",
    "max_chars",
    "per_message_max_chars",
    "max_tokens",
    "max_tokens_fraction",
    "token_encoding",
    "keep_first_user_message",
    "previous_result_max_chars",
    "current_message_max_chars",
    "context_passing",
    "resume_native_sessions",
    "resume_max_context_fraction",
    "summaries_enabled",
    "summary_bot",
    "summary_threshold_turns",
    "summary_max_chars",
)


# Where an effective value came from, most specific first.
SOURCE_TASK_TYPE = "task_type"
SOURCE_DEFAULT_ROW = "default"
SOURCE_ENVIRONMENT = "environment"
SOURCE_BUILT_IN = "built-in"


@dataclass(frozen=True)
class ResolvedPolicy:
    """The policy a dispatch uses and where it came from."""

    policy: PromptPolicy
    row: HistoryPolicy | None  # the most specific row that applies, if any
    source: str  # "row" or "settings"
    # For each policy field: SOURCE_TASK_TYPE, SOURCE_DEFAULT_ROW, SOURCE_ENVIRONMENT or
    # SOURCE_BUILT_IN.
    sources: Mapping[str, str] = field(default_factory=dict)
    # Each policy field's effective value, before the kill switch.
    values: Mapping[str, Any] = field(default_factory=dict)

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


def builder_policy(values: Mapping[str, Any]) -> PromptPolicy:
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
        return PromptPolicy.model_validate(data)
    except ValidationError as error:
        first = error.errors()[0]
        reason = first["msg"].removeprefix("Value error, ")
        field = ".".join(str(part) for part in first["loc"]) or None
        if field is None:
            # A rule across fields: name the field the reason starts with.
            field = next((name for name in POLICY_FIELDS if reason.startswith(name)), None)
        message = f"{field}: {reason}" if field else reason
        raise InvalidInput(message, field=field or "policy") from None


def check_summary_bot(policy: PromptPolicy) -> None:
    """InvalidInput naming `summary_bot` when it names no registered bot (one query, only when
    a bot is named)."""
    if policy.summary_bot is not None and not Bot.objects.filter(name=policy.summary_bot).exists():
        raise InvalidInput(
            f"summary_bot: bot {policy.summary_bot!r} is not registered (GET /api/bots/ lists "
            "the bots).",
            field="summary_bot",
        )


def row_values(row: HistoryPolicy) -> dict[str, Any]:
    return {name: getattr(row, name) for name in POLICY_FIELDS}


def inherited_value(name: str) -> tuple[Any, str]:
    """A field's value and source when no row sets it: the environment, else built in."""
    defaults = settings.EXECUTOR_HISTORY_DEFAULTS
    if name in defaults:
        source = (
            SOURCE_ENVIRONMENT
            if name in settings.EXECUTOR_HISTORY_FROM_ENVIRONMENT
            else SOURCE_BUILT_IN
        )
        return defaults[name], source
    return PromptPolicy.model_fields[name].get_default(call_default_factory=True), SOURCE_BUILT_IN


def effective_values(
    *, own: HistoryPolicy | None, default: HistoryPolicy | None
) -> tuple[dict[str, Any], dict[str, str]]:
    """Each field's effective value and its source, under a task type's row and the default."""
    values: dict[str, Any] = {}
    sources: dict[str, str] = {}
    for name in POLICY_FIELDS:
        if own is not None and name in own.overrides:
            values[name], sources[name] = getattr(own, name), SOURCE_TASK_TYPE
        elif default is not None and name in default.overrides:
            values[name], sources[name] = getattr(default, name), SOURCE_DEFAULT_ROW
        else:
            values[name], sources[name] = inherited_value(name)
    return values, sources


def row_effective_values(
    *, row: HistoryPolicy, default_row: HistoryPolicy | None
) -> tuple[dict[str, Any], dict[str, str]]:
    """What ``row`` resolves to: over the default row, unless it is the default row itself."""
    if row.is_default:
        return effective_values(own=None, default=row)
    return effective_values(own=row, default=default_row)


def settings_policy() -> PromptPolicy:
    values, _ = effective_values(own=None, default=None)
    return builder_policy(values)


def _apply_kill_switch(policy: PromptPolicy) -> PromptPolicy:
    if settings.EXECUTOR_HISTORY_ENABLED:
        return policy
    return policy.model_copy(update={"enabled": False})


def resolve_from_rows(*, task_type: str, rows: Mapping[str, HistoryPolicy]) -> ResolvedPolicy:
    """Resolve with rows already fetched (keyed by task type), for batch dispatch."""
    own = rows.get(task_type) if task_type != DEFAULT_TASK_TYPE else None
    default = rows.get(DEFAULT_TASK_TYPE)
    values, sources = effective_values(own=own, default=default)
    row = own or default
    return ResolvedPolicy(
        policy=_apply_kill_switch(builder_policy(values)),
        row=row,
        source="row" if row is not None else "settings",
        sources=sources,
        values=values,
    )


def policy_rows(
    *, task_types: set[str], configuration_version: int | None = None
) -> dict[str, HistoryPolicy]:
    """The rows that can apply to these task types (one query, none when this process read
    the same rows under `configuration_version`, see `backend.configuration_cache`)."""
    wanted = tuple(sorted(set(task_types) | {DEFAULT_TASK_TYPE}))
    rows = CONFIGURATION.read(
        version=configuration_version,
        key=("policies", wanted),
        load=lambda: tuple(HistoryPolicy.objects.filter(task_type__in=wanted)),
    )
    return {row.task_type: row for row in rows}


def resolve_policy(*, task_type: str) -> ResolvedPolicy:
    return resolve_from_rows(task_type=task_type, rows=policy_rows(task_types={task_type}))


def save_policy(
    *,
    row: HistoryPolicy,
    changed_by: User | None,
    values: Mapping[str, Any],
    inherit: Iterable[str] = (),
) -> HistoryPolicy:
    """Validate and store new cap values; the version goes up by one on every change.

    Every field in `values` becomes one this row sets (even when equal to what it would
    inherit); every field in `inherit` goes back to being inherited. The policy the row then
    resolves to is validated as a whole, inherited values included.
    """
    inherit = set(inherit)
    unknown = sorted(inherit - set(POLICY_FIELDS))
    if unknown:
        raise InvalidInput(f"{unknown[0]} is not a policy field.", field="inherit")
    setting = {k: v for k, v in values.items() if k in POLICY_FIELDS}
    both = sorted(inherit & set(setting))
    if both:
        raise InvalidInput(f"{both[0]} cannot be both set and inherited.", field="inherit")
    overrides = [
        name
        for name in POLICY_FIELDS
        if (name in row.overrides or name in setting) and name not in inherit
    ]
    draft = HistoryPolicy(
        task_type=row.task_type, overrides=overrides, **{**row_values(row), **setting}
    )
    default_row = (
        None
        if row.is_default
        else HistoryPolicy.objects.filter(task_type=DEFAULT_TASK_TYPE).first()
    )
    check_summary_bot(builder_policy(row_effective_values(row=draft, default_row=default_row)[0]))
    with transaction.atomic():
        for name, value in setting.items():
            setattr(row, name, value)
        row.overrides = overrides
        row.updated_by = changed_by
        if row.pk is None:
            row.version = 1
            row.save()
        else:
            row.version = F("version") + 1
            row.save()
            row.refresh_from_db(fields=["version"])
    return row


def set_policy(
    *,
    task_type: str,
    values: Mapping[str, Any],
    changed_by: User | None = None,
    inherit: Iterable[str] = (),
) -> HistoryPolicy:
    """`save_policy` on the task type's row, creating the row when the type has none."""
    row = HistoryPolicy.objects.filter(task_type=task_type).first()
    return save_policy(
        row=row or HistoryPolicy(task_type=task_type),
        changed_by=changed_by,
        values=values,
        inherit=inherit,
    )
