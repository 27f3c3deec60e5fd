"""Services that write tasks and turns, by sub-domain: `tasks` (creating a task, resolving its
pipeline), `follow_ups` (follow-ups, their strategies and the queue), `results` (recording a
result), `cancelling` (cancelling, interrupting, rolling back), `status` (a task's status from
its latest round), on the ground of `rounds` (the task's lock, its message ids, storing a
round) and `validation` (the checks every request's text passes). This package re-exports the
names the rest of Baton uses.

Each service runs in one transaction: either every turn of a request is stored or none is, so a
rejected follow-up never leaves a half-written round behind. The services that may spill text to
an artifact open it with `atomic_storing_artifacts()`, so a rollback leaves no stored file
behind either.
"""

from backend.tasks.services.cancelling import (
    cancel_task,
    cancel_turn,
)
from backend.tasks.services.follow_ups import (
    FollowUp,
    append_message,
    follow_up_strategy,
    recorded_sender,
    send_message,
    withdraw_queued_message,
)
from backend.tasks.services.results import (
    record_result,
    restore_spilled_text,
    result_with_uploaded_value,
)
from backend.tasks.services.rounds import allocate_message_ids, lock_task
from backend.tasks.services.status import refresh_task_status
from backend.tasks.services.tasks import (
    PipelineStep,
    check_pipeline_length,
    create_task,
    resolve_pipeline,
)
from backend.tasks.services.validation import check_text_size, validate_message_text

__all__ = [
    "FollowUp",
    "PipelineStep",
    "allocate_message_ids",
    "append_message",
    "cancel_task",
    "cancel_turn",
    "check_pipeline_length",
    "check_text_size",
    "create_task",
    "follow_up_strategy",
    "lock_task",
    "record_result",
    "recorded_sender",
    "refresh_task_status",
    "resolve_pipeline",
    "restore_spilled_text",
    "result_with_uploaded_value",
    "send_message",
    "validate_message_text",
    "withdraw_queued_message",
]
