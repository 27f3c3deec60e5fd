"""Tasks, their turns and the bots that answer them.

A `Task` is one conversation between a product's users and one or more agent bots. Each turn is a
`Subtask`: a USER message, or an ASSISTANT turn that an executor worker will run. A summary job
is a `Subtask` too (kind `summary`): an ASSISTANT row the dispatch queue claims, leases and
fences like a turn, but which is no part of the conversation — it answers no message, holds no
task's status, never blocks a follow-up and is never shown as a turn. Turns are
numbered by `message_id`, unique within the task and allocated from the task row's counter so
concurrent writers never collide (see `services.allocate_message_ids`). A `Bot` is a registered
agent: which executor runs it and with which model, instructions, permissions and limits. A
`LanguageModel` row is the model table: what a model's context window, maximum output and
tokenizer are, so a bot's model decides how much prompt it gets (backend/dispatch/budgets.py).
"""

from backend.tasks.follow_up_strategies import FollowUpStrategy
from backend.tasks.models.configuration import (
    DATED_SNAPSHOT,
    INSTRUCTIONS_MAX_CHARS,
    Bot,
    LanguageModel,
    PermissionMode,
    validate_bot_name,
)
from backend.tasks.models.progress import ProgressPiece
from backend.tasks.models.queued_messages import QueuedMessage, QueuedMessageStatus
from backend.tasks.models.sessions import NativeSession, TranscriptPart
from backend.tasks.models.steers import Steer, SteerStatus
from backend.tasks.models.tasks import (
    TASK_TYPE_PATTERN,
    Task,
    TaskEvent,
    TaskStatus,
    task_type_validator,
)
from backend.tasks.models.turns import (
    ACTIVE_SUBTASK_STATUSES,
    CONTEXT_PASSING_CHOICES,
    ROLE_CHOICES,
    STOPPED_SUBTASK_STATUSES,
    TURNS,
    Subtask,
    SubtaskKind,
    SubtaskStatus,
    message_name,
)

__all__ = [
    "message_name",
    "ACTIVE_SUBTASK_STATUSES",
    "CONTEXT_PASSING_CHOICES",
    "DATED_SNAPSHOT",
    "INSTRUCTIONS_MAX_CHARS",
    "ROLE_CHOICES",
    "STOPPED_SUBTASK_STATUSES",
    "TASK_TYPE_PATTERN",
    "TURNS",
    "Bot",
    "FollowUpStrategy",
    "LanguageModel",
    "NativeSession",
    "PermissionMode",
    "ProgressPiece",
    "QueuedMessage",
    "QueuedMessageStatus",
    "Subtask",
    "SubtaskKind",
    "SubtaskStatus",
    "Steer",
    "SteerStatus",
    "Task",
    "TaskEvent",
    "TaskStatus",
    "TranscriptPart",
    "task_type_validator",
    "validate_bot_name",
]
