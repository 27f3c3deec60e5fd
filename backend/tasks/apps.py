from django.apps import AppConfig


class TasksConfig(AppConfig):
    name = "backend.tasks"
    label = "tasks"
    verbose_name = "Tasks"
