"""Pending turns to claim and texts like a coding task's, for the scenarios that dispatch.

`pending_turns` bulk-creates tasks of two answered rounds and one pending turn each (what
ingestion would have stored for them): the claims, the CPU of one dispatch, the dispatch cycle
over HTTP, a progress post and the load profile all claim from them.
"""

from __future__ import annotations

import math
import random

# The words `text_of` draws from: prose, commands and code, as in a coding task.
VOCABULARY = (
    "the test upload fails because cleanup races with a reader of the shared tmp dir so we "
    "give each test its own tmp_path and keep the retry constant unchanged; run pytest -q "
    "tests/test_upload.py again: 212 passed, 3 failed in 4.2s. def store(path, data): "
    "return path.write_bytes(data) # the migration adds an index on (task_id, message_id)"
)
WORDS = VOCABULARY.split()
BUILD_LOG = "".join(f"build step {step:05d}: compiled module ok\n" for step in range(600))


def text_of(rng: random.Random, *, label: str, low: int, high: int) -> str:
    """Prose-and-code text of a length drawn log-uniformly between `low` and `high` chars,
    starting with `label` so no two turns have the same text."""
    target = int(math.exp(rng.uniform(math.log(low), math.log(high))))
    words = [label]
    size = len(label)
    while size < target:
        word = rng.choice(WORDS)
        words.append(word)
        size += len(word) + 1
    return " ".join(words)


def answer_of(rng: random.Random, number: int) -> str:
    """An answer: one in a hundred a long build log (it spills), the others 200-4,000 chars."""
    if number % 100 == 99:
        return f"Answer {number}: the build log follows.\n{BUILD_LOG}"
    return text_of(rng, label=f"Answer {number}:", low=200, high=4000)


def pending_turns(turns: int) -> None:
    """`turns` tasks, each with two answered rounds and one pending Codex turn."""
    from django.contrib.auth import get_user_model
    from django.utils import timezone

    from backend.prompting import Role
    from backend.tasks.ingestion import ingest_text
    from backend.tasks.models import Subtask, SubtaskStatus, Task, TaskStatus

    owner, _ = get_user_model().objects.get_or_create(username="bench-owner")
    now = timezone.now()
    texts = {
        "q1": "Please look at the failing upload test and explain the cause.",
        "a1": "The test shares a temporary directory with another test; cleanup races.",
        "q2": "Good. Fix it and keep the retry logic.",
        "a2": "Done: each test gets its own tmp_path; the retry constant is unchanged.",
        "q3": "Now add a regression test for the race.",
    }
    measured = {key: ingest_text(text=text, task=None) for key, text in texts.items()}
    pipeline = [
        {"bot": "assistant", "executor": "codex", "context_passing": "original_and_previous"}
    ]
    batch = 1000
    for start in range(0, turns, batch):
        tasks = Task.objects.bulk_create(
            [
                Task(
                    owner=owner,
                    title=f"bench {number}",
                    task_type="code",
                    status=TaskStatus.PENDING,
                    pipeline=pipeline,
                    next_message_id=7,
                )
                for number in range(start, min(start + batch, turns))
            ]
        )
        rows = []
        for task in tasks:
            for message_id, key in enumerate(["q1", "a1", "q2", "a2", "q3"], start=1):
                ingested = measured[key]
                user = key.startswith("q")
                rows.append(
                    Subtask(
                        task=task,
                        message_id=message_id,
                        parent_message_id=None if user else message_id - 1,
                        role=Role.USER if user else Role.ASSISTANT,
                        status=SubtaskStatus.COMPLETED,
                        bot="" if user else "assistant",
                        executor="" if user else "codex",
                        message=texts[key] if user else "",
                        result=None if user else {"value": texts[key]},
                        history_text=ingested.history_text,
                        history_text_tokens=ingested.history_text_tokens,
                        history_text_tokens_o200k=ingested.history_text_tokens_o200k,
                        history_chars=ingested.chars,
                        history_bytes=ingested.bytes,
                        history_lines=ingested.lines,
                        history_tokens=ingested.tokens,
                        recorded_at=now,
                    )
                )
            rows.append(
                Subtask(
                    task=task,
                    message_id=6,
                    parent_message_id=5,
                    role=Role.ASSISTANT,
                    status=SubtaskStatus.PENDING,
                    bot="assistant",
                    pipeline_step=0,
                    executor="codex",
                    context_passing="original_and_previous",
                    pending_since=now,
                )
            )
        Subtask.objects.bulk_create(rows)
