from django.urls import path
from drf_spectacular.views import SpectacularAPIView, SpectacularRedocView, SpectacularSwaggerView

from backend.api import views

urlpatterns = [
    path("tasks/", views.TaskListCreateApi.as_view(), name="task-list"),
    path("tasks/<int:task_id>/", views.TaskDetailApi.as_view(), name="task-detail"),
    path("tasks/<int:task_id>/messages/", views.TaskMessagesApi.as_view(), name="task-messages"),
    path("tasks/<int:task_id>/subtasks/", views.TaskSubtasksApi.as_view(), name="task-subtasks"),
    path("tasks/<int:task_id>/cancel/", views.TaskCancelApi.as_view(), name="task-cancel"),
    path("schema/", SpectacularAPIView.as_view(), name="schema"),
    path("docs/", SpectacularSwaggerView.as_view(url_name="schema"), name="docs"),
    path("redoc/", SpectacularRedocView.as_view(url_name="schema"), name="redoc"),
]
