from django.apps import AppConfig


class DispatchConfig(AppConfig):
    name = "backend.dispatch"
    label = "dispatch"
    verbose_name = "Dispatch"
