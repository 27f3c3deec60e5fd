"""The follow-up strategies are one list: every place that takes or handles one reads it.

A strategy added to `FollowUpStrategy` is accepted by the setting, the task model and the task
API at once; it needs a handler, which the first test asks for. What each strategy does is
tested through the API in tests/api/test_follow_up_strategies.py.
"""

from __future__ import annotations

import pytest

from backend.api.serializers import MessageInput, TaskCreateInput
from backend.tasks.follow_up_strategies import FollowUpStrategy, listed
from backend.tasks.models import Task
from backend.tasks.services.follow_ups import HANDLERS
from settings.environment import ConfigurationError, load_environment


def test_every_strategy_has_a_handler():
    assert set(HANDLERS) == set(FollowUpStrategy)


@pytest.mark.parametrize("strategy", FollowUpStrategy.values)
def test_the_setting_takes_every_strategy(strategy):
    env = load_environment({"BATON_FOLLOW_UP_STRATEGY": strategy})
    assert env.follow_up_strategy == strategy


def test_the_setting_refuses_another_value_naming_the_strategies():
    with pytest.raises(ConfigurationError) as refused:
        load_environment({"BATON_FOLLOW_UP_STRATEGY": "later"})
    assert listed(f"'{value}'" for value in FollowUpStrategy.values) in str(refused.value)


def test_the_task_model_and_the_task_api_offer_the_strategies():
    field = Task._meta.get_field("follow_up_strategy")
    assert [value for value, _ in field.choices] == FollowUpStrategy.values
    (constraint,) = [c for c in Task._meta.constraints if c.name == "task_follow_up_strategy_valid"]
    assert constraint.condition.children == [("follow_up_strategy__in", ["", *FollowUpStrategy])]
    for serializer, name in ((TaskCreateInput, "follow_up_strategy"), (MessageInput, "strategy")):
        assert list(serializer().fields[name].choices) == FollowUpStrategy.values


@pytest.mark.parametrize(
    ("strategies", "sentence"),
    [
        (["reject"], "reject"),
        (["enqueue", "rollback"], "enqueue or rollback"),
        (["reject", "enqueue", "interrupt", "rollback"], "reject, enqueue, interrupt or rollback"),
    ],
)
def test_listed_names_strategies_as_a_sentence(strategies, sentence):
    assert listed(strategies) == sentence
