"""The API's URL map (under /api/, `backend.urls`).

Names and ids in a path (`<text:...>`: artifacts, bots, policies) are any text but `/`, as
Django's `str` converter takes them, except that a NUL refuses the request with 400
`bad_request` before any view runs: no id or name holds one, and PostgreSQL cannot compare a
text column with a string that does (its query would fail with a 500). Row ids (`<id:...>`)
are Django's `int` up to the largest id a row can have: a larger one names no row (404), where
the database could not even compare it (a 500).
"""

from django.urls import path, register_converter
from django.urls.converters import IntConverter, StringConverter
from drf_spectacular.views import SpectacularRedocView, SpectacularSwaggerView

from backend.api import executor_views, policy_views, views, webhook_views
from backend.api.artifact_views import ArtifactContentApi, ArtifactDetailApi
from backend.api.errors import PathHoldsNul
from backend.api.event_views import TaskEventsApi
from backend.api.health_views import HealthApi
from backend.api.prompt_report_views import PromptReportDetailApi
from backend.api.schema_views import SchemaApi
from backend.api.serializers import MAX_ROW_ID


class PathText(StringConverter):
    """Django's `str` converter, refusing a NUL (`PathHoldsNul`, a 400)."""

    def to_python(self, value: str) -> str:
        if "\x00" in value:
            raise PathHoldsNul()
        return value


register_converter(PathText, "text")


class RowId(IntConverter):
    """Django's `int` converter, up to MAX_ROW_ID (a larger number matches no URL: 404)."""

    def to_python(self, value: str) -> int:
        number = int(value)
        if number > MAX_ROW_ID:
            raise ValueError("no row has an id this large")
        return number


register_converter(RowId, "id")

urlpatterns = [
    path("tasks/", views.TaskListCreateApi.as_view(), name="task-list"),
    path("tasks/<id:task_id>/", views.TaskDetailApi.as_view(), name="task-detail"),
    path("tasks/<id:task_id>/messages/", views.TaskMessagesApi.as_view(), name="task-messages"),
    path("tasks/<id:task_id>/subtasks/", views.TaskSubtasksApi.as_view(), name="task-subtasks"),
    path("tasks/<id:task_id>/cancel/", views.TaskCancelApi.as_view(), name="task-cancel"),
    path("tasks/<id:task_id>/events/", TaskEventsApi.as_view(), name="task-events"),
    path(
        "tasks/<id:task_id>/queued-messages/<id:queued_id>/cancel/",
        views.QueuedMessageCancelApi.as_view(),
        name="queued-message-cancel",
    ),
    path("artifacts/<text:artifact_id>/", ArtifactDetailApi.as_view(), name="artifact-detail"),
    path(
        "artifacts/<text:artifact_id>/content/",
        ArtifactContentApi.as_view(),
        name="artifact-content",
    ),
    path(
        "tasks/<id:task_id>/subtasks/<id:subtask_id>/text/",
        views.TurnTextApi.as_view(),
        name="turn-text",
    ),
    path(
        "tasks/<id:task_id>/subtasks/<id:subtask_id>/cancel/",
        views.TurnCancelApi.as_view(),
        name="turn-cancel",
    ),
    path(
        "prompt-reports/<id:report_id>/",
        PromptReportDetailApi.as_view(),
        name="prompt-report-detail",
    ),
    path("bots/", views.BotListApi.as_view(), name="bot-list"),
    path("bots/<text:name>/", views.BotDetailApi.as_view(), name="bot-detail"),
    path("executor/dispatch/", executor_views.DispatchApi.as_view(), name="executor-dispatch"),
    path(
        "executor/heartbeat/",
        executor_views.HeartbeatBatchApi.as_view(),
        name="executor-heartbeat-batch",
    ),
    path(
        "executor/subtasks/<id:subtask_id>/heartbeat/",
        executor_views.HeartbeatApi.as_view(),
        name="executor-heartbeat",
    ),
    path(
        "executor/subtasks/<id:subtask_id>/stopped/",
        executor_views.StoppedApi.as_view(),
        name="executor-stopped",
    ),
    path(
        "executor/subtasks/<id:subtask_id>/progress/",
        executor_views.ProgressApi.as_view(),
        name="executor-progress",
    ),
    path(
        "executor/subtasks/<id:subtask_id>/result/",
        executor_views.ResultApi.as_view(),
        name="executor-result",
    ),
    path(
        "executor/subtasks/<id:subtask_id>/result/value/",
        executor_views.ResultValueApi.as_view(),
        name="executor-result-value",
    ),
    path("policies/", policy_views.PolicyListApi.as_view(), name="policy-list"),
    path("policies/<text:name>/", policy_views.PolicyDetailApi.as_view(), name="policy-detail"),
    path("webhooks/", webhook_views.WebhookListCreateApi.as_view(), name="webhook-list"),
    path(
        "webhooks/<id:endpoint_id>/",
        webhook_views.WebhookDetailApi.as_view(),
        name="webhook-detail",
    ),
    path(
        "webhooks/<id:endpoint_id>/deliveries/",
        webhook_views.WebhookDeliveriesApi.as_view(),
        name="webhook-deliveries",
    ),
    path("health/", HealthApi.as_view(), name="health"),
    path("schema/", SchemaApi.as_view(), name="schema"),
    path("docs/", SpectacularSwaggerView.as_view(url_name="schema"), name="docs"),
    path("redoc/", SpectacularRedocView.as_view(url_name="schema"), name="redoc"),
]
