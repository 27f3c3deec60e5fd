"""Policy resolution, validation, versioning and the kill switch."""

from __future__ import annotations

import pytest

from backend.dispatch.models import HistoryPolicy
from backend.dispatch.policies import builder_policy, resolve_policy, save_policy
from backend.errors import InvalidInput
from backend.prompting import build_prompt
from backend.tasks.history import prompt_input_for
from backend.tasks.models import SubtaskStatus
from backend.tasks.services import PipelineStep, append_message, create_task, record_result
from settings.environment import load_environment

pytestmark = pytest.mark.django_db


def test_shipped_policies():
    code = resolve_policy(task_type="code")
    chat = resolve_policy(task_type="chat")
    assert (code.policy.max_messages, code.policy.max_chars) == (20, 40_000)
    assert (chat.policy.max_messages, chat.policy.max_chars) == (12, 20_000)
    assert chat.policy.per_message_max_chars == 4_000
    assert (code.source, code.row.task_type, code.version) == ("row", "code", 1)


def test_unknown_type_uses_the_default_row_then_settings(settings):
    resolved = resolve_policy(task_type="research")
    assert resolved.row.task_type == ""
    HistoryPolicy.objects.filter(task_type="").delete()
    settings.EXECUTOR_HISTORY_DEFAULTS = {**settings.EXECUTOR_HISTORY_DEFAULTS, "max_messages": 7}
    resolved = resolve_policy(task_type="research")
    assert (resolved.source, resolved.row, resolved.policy.max_messages) == ("settings", None, 7)


def test_changes_bump_the_version_and_apply_at_once(staff_user):
    row = HistoryPolicy.objects.get(task_type="chat")
    save_policy(row=row, changed_by=staff_user, values={"max_messages": 3})
    row.refresh_from_db()
    assert (row.version, row.max_messages, row.updated_by) == (2, 3, staff_user)
    assert resolve_policy(task_type="chat").policy.max_messages == 3
    save_policy(row=row, changed_by=staff_user, values={"enabled": False})
    assert resolve_policy(task_type="chat").version == 3


@pytest.mark.parametrize(
    ("values", "field", "fragment"),
    [
        (
            {"per_message_max_chars": 50_000},
            "per_message_max_chars",
            "per_message_max_chars must not exceed",
        ),
        ({"max_tokens": 10}, "max_tokens", "at least 1024"),
        (
            {"token_encoding": "no_such_encoding"},
            "token_encoding",
            "not a token encoding Baton bundles",
        ),
        ({"max_messages": 0}, "max_messages", "positive"),
    ],
)
def test_invalid_combinations_are_refused_with_the_reason(staff_user, values, field, fragment):
    row = HistoryPolicy.objects.get(task_type="code")
    with pytest.raises(InvalidInput, match=fragment) as error:
        save_policy(row=row, changed_by=staff_user, values=values)
    if field:
        assert error.value.field == field
    row.refresh_from_db()
    assert (row.version, row.max_messages) == (1, 20)


def test_global_kill_switch(settings):
    settings.EXECUTOR_HISTORY_ENABLED = False
    assert resolve_policy(task_type="code").policy.enabled is False


def test_builder_policy_takes_ingestion_sizes_from_settings(settings):
    settings.BATON_SPILL_THRESHOLD_CHARS = 9_000
    assert builder_policy({}).spill_threshold_chars == 9_000


def test_environment_settings_take_effect_under_the_shipped_rows(settings, user):
    """EXECUTOR_HISTORY_MAX_MESSAGES=3 bounds a prompt although the shipped rows exist."""
    settings.EXECUTOR_HISTORY_DEFAULTS = {**settings.EXECUTOR_HISTORY_DEFAULTS, "max_messages": 3}
    settings.EXECUTOR_HISTORY_FROM_ENVIRONMENT = frozenset({"max_messages"})
    code = resolve_policy(task_type="code")
    assert (code.policy.max_messages, code.sources["max_messages"]) == (3, "environment")
    assert code.sources["max_chars"] == "built-in"
    chat = resolve_policy(task_type="chat")
    assert (chat.policy.max_messages, chat.sources["max_messages"]) == (12, "task_type")

    task = create_task(
        owner=user,
        title="t",
        task_type="code",
        message="q0",
        pipeline=[PipelineStep(executor="agno")],
    )
    for number in range(1, 6):
        turn = task.subtasks.get(status=SubtaskStatus.PENDING)
        record_result(subtask=turn, status=SubtaskStatus.COMPLETED, result={"value": f"a{number}"})
        append_message(task=task, message=f"q{number}")
    turn = task.subtasks.get(status=SubtaskStatus.PENDING)
    build = build_prompt(prompt_input_for(subtask=turn, task=task, policy=code.policy), code.policy)
    # The pinned first message and the newest whole round, out of 10.
    assert build.report.messages_included == 3


def test_a_row_sets_only_its_overrides_and_the_default_row_fills_in(staff_user):
    default = HistoryPolicy.objects.get(task_type="")
    save_policy(row=default, changed_by=staff_user, values={"per_message_max_chars": 1_000})
    code = resolve_policy(task_type="code")
    assert (code.policy.per_message_max_chars, code.sources["per_message_max_chars"]) == (
        1_000,
        "default",
    )
    row = HistoryPolicy.objects.get(task_type="code")
    save_policy(row=row, changed_by=staff_user, values={"per_message_max_chars": 2_000})
    assert resolve_policy(task_type="code").policy.per_message_max_chars == 2_000
    save_policy(row=row, changed_by=staff_user, values={}, inherit=["per_message_max_chars"])
    row.refresh_from_db()
    assert (row.overrides, row.version) == ([], 3)
    assert resolve_policy(task_type="code").policy.per_message_max_chars == 1_000


def test_the_inherited_policy_is_validated_as_a_whole(staff_user):
    """A row's own value is checked against what it inherits (here: the default row's cap)."""
    default = HistoryPolicy.objects.get(task_type="")
    save_policy(row=default, changed_by=staff_user, values={"max_chars": 5_000})
    with pytest.raises(InvalidInput, match="per_message_max_chars must not exceed"):
        save_policy(
            row=HistoryPolicy.objects.get(task_type="code"),
            changed_by=staff_user,
            values={"per_message_max_chars": 6_000},
        )


@pytest.mark.parametrize("value", [2**31, 2**63])
def test_a_cap_beyond_its_column_is_refused_by_the_service(staff_user, value):
    """Not only the API: any caller of save_policy gets InvalidInput naming the field."""
    row = HistoryPolicy.objects.get(task_type="code")
    with pytest.raises(InvalidInput) as error:
        save_policy(row=row, changed_by=staff_user, values={"max_tokens": value})
    assert error.value.field == "max_tokens"
    assert "at most 2147483647" in error.value.message
    row.refresh_from_db()
    assert (row.version, row.max_tokens) == (1, None)


def test_the_environment_records_which_history_settings_it_set():
    env = load_environment({"EXECUTOR_HISTORY_MAX_MESSAGES": "2", "EXECUTOR_HISTORY_ENABLED": "1"})
    assert env.history_fields_from_environment == {"max_messages"}
    assert load_environment({}).history_fields_from_environment == frozenset()
