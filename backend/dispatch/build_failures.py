"""Build failures: a claimed turn whose payload cannot be built is released at once.

Released means requeued, or failed after its last attempt (or at once, when a prompt retried
after a context overflow cannot fit its tightened budget), rather than left RUNNING until its
lease expires. The failure is logged by its exception's type only: its text may quote content
(docs/architecture.md, principle 7).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import TypeVar

from django.conf import settings
from django.db import transaction

from backend.dispatch.leases import attempts_used, requeue
from backend.dispatch.overflow import fail_unbuildable
from backend.events import log_event, opaque_id
from backend.prompting import PromptBudgetError
from backend.tasks.models import Subtask, SubtaskStatus
from backend.tasks.services import lock_task, record_result

T = TypeVar("T")


@dataclass(frozen=True)
class Releasing:
    """The one place a failure to build payloads releases their claims, for the claim of
    `worker_id`."""

    worker_id: str

    def on_failure(self, stage: Callable[[], T], *, release: Iterable[Subtask]) -> T | None:
        """What `stage` returns (never None), or None when it raised: then each claimed row
        of `release` is released."""
        try:
            return stage()
        except Exception as error:  # noqa: BLE001 - whatever failed, the claim must not stay RUNNING
            for subtask in release:
                self.release(subtask, error)
            return None

    def release(self, subtask: Subtask, error: Exception) -> None:
        """Log that `subtask`'s payload could not be built, and release its claim."""
        _build_failed(subtask=subtask, worker_id=self.worker_id, error=error)


def _build_failed(*, subtask: Subtask, worker_id: str, error: Exception) -> None:
    # The exception text may quote content; log only its type (principle 7).
    log_event(
        "dispatch_build_failed",
        level=logging.ERROR,
        task=subtask.task_id,
        subtask=subtask.pk,
        attempt=subtask.attempts,
        error_type=opaque_id(type(error).__name__),
    )
    _release_failed_claim(subtask=subtask, worker_id=worker_id, error=error)


def _release_failed_claim(*, subtask: Subtask, worker_id: str, error: Exception) -> None:
    """Undo a claim whose payload could not be built; after the last attempt, fail the turn.

    A turn retried after a context overflow whose prompt does not fit its tightened budget
    fails at once: another attempt would build the same prompt (see `overflow`).
    """
    with transaction.atomic():
        lock_task(task_id=subtask.task_id)
        current = Subtask.objects.filter(
            pk=subtask.pk, status=SubtaskStatus.RUNNING, lease_owner=worker_id
        ).first()
        if current is None:
            return
        if isinstance(error, PromptBudgetError) and current.token_cap is not None:
            fail_unbuildable(subtask=current, max_tokens=current.token_cap)
            return
        reason = type(error).__name__
        error_text = f"Baton could not build this turn's prompt ({reason})."
        if attempts_used(subtask=current) >= settings.BATON_MAX_ATTEMPTS:
            record_result(
                subtask=current,
                status=SubtaskStatus.FAILED,
                error=error_text,
                error_code="prompt_build_failed",
            )
        else:
            requeue(subtask=current, error=error_text, error_code="prompt_build_failed")
