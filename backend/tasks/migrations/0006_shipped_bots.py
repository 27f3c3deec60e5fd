"""Shipped bots: one default per executor, so a task that names only an executor can run."""

from django.db import migrations

SHIPPED = [
    {"name": "codex", "executor": "codex", "model": "gpt-5.5"},
    {"name": "claude-code", "executor": "claude_code", "model": "claude-sonnet-4-5"},
    {"name": "agno", "executor": "agno", "model": "gpt-5.5"},
]


def create_shipped_bots(apps, schema_editor):
    Bot = apps.get_model("tasks", "Bot")
    for values in SHIPPED:
        has_default = Bot.objects.filter(executor=values["executor"], is_default=True).exists()
        Bot.objects.get_or_create(
            name=values["name"], defaults={**values, "is_default": not has_default}
        )


def remove_shipped_bots(apps, schema_editor):
    Bot = apps.get_model("tasks", "Bot")
    Bot.objects.filter(name__in=[values["name"] for values in SHIPPED]).delete()


class Migration(migrations.Migration):
    dependencies = [("tasks", "0005_bots_retries_error_codes")]

    operations = [migrations.RunPython(create_shipped_bots, remove_shipped_bots)]
