"""A dispatch reuses what its process read of the bots, the model table and the history
policies while the configuration version stays the same, and sees every change at once,
whoever makes it (`backend.configuration_cache`, `dispatch.models.ConfigurationVersion`)."""

from __future__ import annotations

import pytest
from django.db import connection, transaction
from django.test.utils import CaptureQueriesContext

from backend.configuration_cache import MAX_READS, ConfigurationReads
from backend.dispatch.budgets import set_learned_overhead
from backend.dispatch.claims import claim_turns
from backend.dispatch.models import ConfigurationVersion, HistoryPolicy
from backend.dispatch.policies import save_policy
from backend.tasks.models import Bot, LanguageModel
from backend.tasks.services import PipelineStep, create_task
from tests.conftest import register_bot

pytestmark = pytest.mark.django_db

CONFIGURATION_TABLES = ("tasks_bot", "tasks_languagemodel", "dispatch_historypolicy")


def _version() -> int | None:
    return ConfigurationVersion.objects.values_list("value", flat=True).first()


def _pending(user, count: int = 1) -> None:
    for number in range(count):
        create_task(
            owner=user,
            title=f"task {number}",
            task_type="code",
            message="Fix the build.",
            pipeline=[PipelineStep(bot="coder", executor="codex")],
        )


def _claim(worker):
    """One claimed turn, and the statements its claim sent."""
    with CaptureQueriesContext(connection) as queries:
        [turn] = claim_turns(worker=worker, worker_id="w", kinds=["codex"], limit=1)
    return turn, [query["sql"] for query in queries.captured_queries]


def _configuration_reads(statements: list[str]) -> list[str]:
    return [
        statement
        for statement in statements
        if statement.lstrip().startswith("SELECT")
        and any(
            f"FROM {table}" in statement or f'FROM "{table}"' in statement
            for table in CONFIGURATION_TABLES
        )
    ]


@pytest.fixture
def coder(db):
    LanguageModel.objects.update_or_create(
        name="gpt-test",
        defaults={
            "provider": "openai",
            "context_window": 64_000,
            "max_output_tokens": 8_000,
            "tokenizer": "o200k_base",
        },
    )
    return register_bot("coder", "codex", model="gpt-test", instructions="Be brief.")


def test_the_next_dispatch_under_the_same_configuration_reads_none_of_it(user, worker, coder):
    _pending(user, count=2)
    first, cold = _claim(worker)
    second, warm = _claim(worker)

    assert len(_configuration_reads(cold)) == 3  # bots, the model table, policies
    assert _configuration_reads(warm) == []
    assert len(warm) == len(cold) - 3
    # The same configuration, reused: the same bot, window and policy in both payloads.
    for turn in (first, second):
        assert turn.bot.instructions == "Be brief."
        assert turn.prompt.budget.context_window == 64_000
        assert turn.report.policy_id == HistoryPolicy.objects.get(task_type="code").pk


def _edit_bot_in_the_admin() -> None:
    bot = Bot.objects.get(name="coder")
    bot.instructions = "Explain each step."
    bot.save()


def _edit_bot_with_an_update() -> None:
    Bot.objects.filter(name="coder").update(instructions="Explain each step.")


def _edit_model_window_by_hand() -> None:
    with connection.cursor() as cursor:
        cursor.execute(
            "UPDATE tasks_languagemodel SET context_window = 32000 WHERE name = 'gpt-test'"
        )


def _remove_the_model() -> None:
    LanguageModel.objects.filter(name="gpt-test").delete()


def _save_policy_in_the_api() -> None:
    save_policy(
        row=HistoryPolicy.objects.get(task_type="code"), changed_by=None, values={"max_messages": 3}
    )


def _remove_the_task_types_policy() -> None:
    HistoryPolicy.objects.filter(task_type="code").delete()


def _policy_row(turn) -> str:
    return HistoryPolicy.objects.get(pk=turn.report.policy_id).task_type


# Each change, what of a dispatched turn shows it, and what that is after the change.
CHANGES = {
    "bot saved": (_edit_bot_in_the_admin, lambda turn: turn.bot.instructions, "Explain each step."),
    "bot updated": (
        _edit_bot_with_an_update,
        lambda turn: turn.bot.instructions,
        "Explain each step.",
    ),
    "model window by SQL": (
        _edit_model_window_by_hand,
        lambda turn: turn.prompt.budget.context_window,
        32_000,
    ),
    "model removed": (_remove_the_model, lambda turn: turn.prompt.budget.context_window, None),
    "policy saved": (
        _save_policy_in_the_api,
        lambda turn: turn.prompt.resolved.policy.max_messages,
        3,
    ),
    # The default row applies to a task type without one of its own.
    "policy row removed": (_remove_the_task_types_policy, _policy_row, ""),
}


@pytest.mark.parametrize("change", list(CHANGES))
def test_every_change_to_the_configuration_reaches_the_next_dispatch(user, worker, coder, change):
    make, seen, expected = CHANGES[change]
    _pending(user, count=2)
    before, _ = _claim(worker)
    assert seen(before) != expected
    version = _version()
    make()

    assert _version() not in (None, version)
    after, statements = _claim(worker)
    assert seen(after) == expected
    assert len(_configuration_reads(statements)) == 3


def test_a_version_is_never_written_twice_even_by_a_transaction_that_rolled_back(coder):
    start = _version()
    with transaction.atomic():
        Bot.objects.filter(name="coder").update(instructions="draft")
        rolled_back = _version()
        transaction.set_rollback(True)
    assert _version() == start  # the change and its version went together
    Bot.objects.filter(name="coder").update(instructions="final")
    assert _version() not in (start, rolled_back)


def test_a_write_that_changes_no_row_keeps_the_version(coder):
    coder.overhead_tokens = 500
    coder.save()
    version = _version()
    # The overhead it holds already: the UPDATE matches no row.
    assert set_learned_overhead(bot=coder, overhead=500) is False
    assert _version() == version
    assert set_learned_overhead(bot=coder, overhead=100) is True
    assert _version() != version


@pytest.mark.django_db(transaction=True)
def test_without_a_version_row_every_dispatch_reads_the_configuration(user, worker, coder):
    """A flushed table (as tests' flushes leave it) makes the claim return no version."""
    ConfigurationVersion.objects.all().delete()
    _pending(user, count=2)
    _, first = _claim(worker)
    _, second = _claim(worker)
    assert len(_configuration_reads(first)) == 3
    assert len(_configuration_reads(second)) == 3


def test_reads_are_kept_per_version_and_dropped_when_it_changes():
    reads = ConfigurationReads()
    loads = []

    def load(value):
        def loader():
            loads.append(value)
            return value

        return loader

    assert reads.read(version=1, key="bots", load=load("a")) == "a"
    assert reads.read(version=1, key="bots", load=load("b")) == "a"
    assert reads.read(version=2, key="bots", load=load("c")) == "c"
    assert reads.read(version=1, key="bots", load=load("d")) == "d"  # nothing kept across
    assert reads.read(version=None, key="bots", load=load("e")) == "e"
    assert reads.read(version=None, key="bots", load=load("f")) == "f"  # never kept
    assert loads == ["a", "c", "d", "e", "f"]


def test_the_reads_kept_stay_bounded():
    reads = ConfigurationReads()
    for key in range(MAX_READS * 3):
        reads.read(version=7, key=key, load=lambda key=key: key)
    assert len(reads._reads) <= MAX_READS
    assert (
        reads.read(version=7, key=MAX_READS * 3 - 1, load=lambda: "reloaded") == MAX_READS * 3 - 1
    )
