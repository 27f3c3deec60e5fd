from django.apps import AppConfig


class WebhooksConfig(AppConfig):
    name = "backend.webhooks"
    label = "webhooks"
    verbose_name = "Webhooks"
