"""The backend's executor kinds: every field, serializer and rule that holds a kind reads
`backend.executor_kinds`."""

from __future__ import annotations

import pytest
from django.db import IntegrityError, transaction
from rest_framework.exceptions import ValidationError

from backend.api.executor_serializers import DispatchInput
from backend.api.serializers import PipelineStepInput, TaskCreateInput
from backend.dispatch.budgets import model_window
from backend.executor_kinds import CHOICES, EXECUTOR_KINDS, KINDS, NAMES
from backend.tasks.models import Bot, NativeSession, Subtask

pytestmark = pytest.mark.django_db


def test_every_field_that_holds_a_kind_offers_exactly_the_kinds():
    for model in (Bot, Subtask, NativeSession):
        assert list(model._meta.get_field("executor").choices) == CHOICES
    assert [kind.name for kind in EXECUTOR_KINDS] == list(NAMES) == list(KINDS)


def test_the_api_accepts_the_kinds_and_nothing_else():
    fields = [
        DispatchInput().fields["kinds"].child,
        TaskCreateInput().fields["executor"],
        PipelineStepInput().fields["executor"],
    ]
    for field in fields:
        assert list(field.choices) == list(NAMES)
        assert field.run_validation("codex") == "codex"
        with pytest.raises(ValidationError):
            field.run_validation("gemini_cli")


def test_the_database_refuses_a_bot_of_an_unknown_kind():
    with pytest.raises(IntegrityError), transaction.atomic():
        Bot.objects.create(name="gemini", executor="gemini_cli", model="gemini-2.5-pro")


@pytest.mark.parametrize("kind", EXECUTOR_KINDS, ids=lambda kind: kind.name)
def test_an_unlearned_bot_budgets_its_kinds_default_overhead(kind):
    bot = Bot(name=f"new-{kind.name}", executor=kind.name, model="", context_window=100_000)
    window = model_window(bot=bot, row=None)
    assert window is not None
    assert (window.overhead_tokens, window.overhead_learned) == (
        kind.default_overhead_tokens,
        False,
    )


def test_every_shipped_bot_names_its_kinds_default_model():
    for bot in Bot.objects.filter(is_default=True):
        assert bot.model == KINDS[bot.executor].default_model
