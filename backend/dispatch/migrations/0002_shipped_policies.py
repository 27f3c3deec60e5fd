"""Shipped history policies: the default row, a larger `code` and a smaller `chat` policy."""

from django.db import migrations

SHIPPED = [
    {"task_type": "", "max_messages": 20, "max_chars": 40_000, "per_message_max_chars": 4_000},
    {"task_type": "code", "max_messages": 20, "max_chars": 40_000, "per_message_max_chars": 4_000},
    {"task_type": "chat", "max_messages": 12, "max_chars": 20_000, "per_message_max_chars": 4_000},
]


def create_shipped_policies(apps, schema_editor):
    HistoryPolicy = apps.get_model("dispatch", "HistoryPolicy")
    for values in SHIPPED:
        HistoryPolicy.objects.get_or_create(task_type=values["task_type"], defaults=values)


def remove_shipped_policies(apps, schema_editor):
    HistoryPolicy = apps.get_model("dispatch", "HistoryPolicy")
    HistoryPolicy.objects.filter(
        task_type__in=[values["task_type"] for values in SHIPPED], version=1
    ).delete()


class Migration(migrations.Migration):
    dependencies = [("dispatch", "0001_initial")]

    operations = [migrations.RunPython(create_shipped_policies, remove_shipped_policies)]
