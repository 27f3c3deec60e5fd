"""Input and output serializers for the task API.

Input serializers check shape and types and reject unknown fields (a misspelt field is an error,
not a silently ignored one); the domain rules live in the services.
"""

from backend.api.serializers.inputs import (
    CancelQuery,
    MessageInput,
    PipelineInput,
    PipelineStepInput,
    TaskCreateInput,
    TaskListFilters,
    TurnListQuery,
    label_name_field,
)
from backend.api.serializers.pages import PAGE_PARAMETERS, page_of
from backend.api.serializers.reports import PromptReportLinkOutput, PromptReportOutput
from backend.api.serializers.strict import (
    MAX_ROW_ID,
    ExecutorTextField,
    StrictInput,
    StrictQuery,
    TextField,
    attempt_field,
    row_id_field,
)
from backend.api.serializers.tasks import (
    BotOutput,
    PipelineStepOutput,
    QueuedMessageOutput,
    SteerOutput,
    TaskOutput,
    TaskWithTurnsOutput,
)
from backend.api.serializers.turns import (
    RESULT_SCHEMA,
    SPILLED_TEXT_SCHEMA,
    TEXT_OR_SPILLED_SCHEMA,
    HistoryMeasureOutput,
    ResultField,
    SpilledArtifactOutput,
    SpilledTextOutput,
    SubtaskOutput,
    TurnPageOutput,
    UsageFields,
)

__all__ = [
    "MAX_ROW_ID",
    "PAGE_PARAMETERS",
    "RESULT_SCHEMA",
    "SPILLED_TEXT_SCHEMA",
    "TEXT_OR_SPILLED_SCHEMA",
    "BotOutput",
    "CancelQuery",
    "ExecutorTextField",
    "HistoryMeasureOutput",
    "MessageInput",
    "PipelineInput",
    "PipelineStepInput",
    "PipelineStepOutput",
    "PromptReportLinkOutput",
    "PromptReportOutput",
    "QueuedMessageOutput",
    "SteerOutput",
    "ResultField",
    "SpilledArtifactOutput",
    "SpilledTextOutput",
    "StrictInput",
    "TextField",
    "StrictQuery",
    "SubtaskOutput",
    "TaskCreateInput",
    "TaskListFilters",
    "TaskOutput",
    "TaskWithTurnsOutput",
    "TurnListQuery",
    "TurnPageOutput",
    "UsageFields",
    "attempt_field",
    "label_name_field",
    "page_of",
    "row_id_field",
]
