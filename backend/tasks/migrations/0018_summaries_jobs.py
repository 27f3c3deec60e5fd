"""Summary jobs: Subtask rows of kind `summary` beside the turns, the task's latest summary, and
the shipped `summarizer` bot an operator may choose for a history policy's summaries."""

import django.db.models.deletion
from django.conf import settings
from django.db import migrations, models

SUMMARIZER = {
    "name": "summarizer",
    "executor": "agno",
    "model": "gpt-5.5",
    "permission_mode": "read_only",
    "timeout_seconds": 600,
    "instructions": (
        "You write rolling summaries of a task's conversation for an agent that will continue "
        "it without the summarized messages. Be faithful and specific: keep goals, "
        "constraints, decisions with their reasons, facts, file names, commands and open "
        "questions; never invent. Answer with the summary only."
    ),
}


def create_summarizer(apps, schema_editor):
    Bot = apps.get_model("tasks", "Bot")
    Bot.objects.get_or_create(name=SUMMARIZER["name"], defaults=SUMMARIZER)


def remove_summarizer(apps, schema_editor):
    Bot = apps.get_model("tasks", "Bot")
    Bot.objects.filter(name=SUMMARIZER["name"]).delete()


class Migration(migrations.Migration):
    dependencies = [
        ("artifacts", "0002_task_transcript"),
        ("tasks", "0017_budget_model_table"),
        migrations.swappable_dependency(settings.AUTH_USER_MODEL),
    ]

    operations = [
        migrations.RemoveConstraint(
            model_name="subtask",
            name="subtask_one_running_per_task",
        ),
        migrations.AddField(
            model_name="subtask",
            name="kind",
            field=models.CharField(
                choices=[("turn", "Turn"), ("summary", "Summary job")],
                default="turn",
                max_length=16,
            ),
        ),
        migrations.AddField(
            model_name="subtask",
            name="summary_first_message_id",
            field=models.PositiveIntegerField(blank=True, null=True),
        ),
        migrations.AddField(
            model_name="subtask",
            name="summary_last_message_id",
            field=models.PositiveIntegerField(blank=True, null=True),
        ),
        migrations.AddField(
            model_name="subtask",
            name="summary_previous",
            field=models.ForeignKey(
                blank=True,
                null=True,
                on_delete=django.db.models.deletion.SET_NULL,
                related_name="+",
                to="tasks.subtask",
            ),
        ),
        migrations.AddField(
            model_name="task",
            name="summary",
            field=models.ForeignKey(
                blank=True,
                null=True,
                on_delete=django.db.models.deletion.SET_NULL,
                related_name="+",
                to="tasks.subtask",
            ),
        ),
        migrations.AddConstraint(
            model_name="subtask",
            constraint=models.UniqueConstraint(
                condition=models.Q(("kind", "turn"), ("status", "RUNNING")),
                fields=("task",),
                name="subtask_one_running_turn_per_task",
            ),
        ),
        migrations.AddConstraint(
            model_name="subtask",
            constraint=models.CheckConstraint(
                condition=models.Q(("kind__in", ["turn", "summary"])), name="subtask_kind_valid"
            ),
        ),
        migrations.AddConstraint(
            model_name="subtask",
            constraint=models.CheckConstraint(
                condition=models.Q(
                    ("kind", "turn"),
                    models.Q(
                        ("parent_message_id__isnull", True),
                        ("role", "ASSISTANT"),
                        ("summary_first_message_id__isnull", False),
                        ("summary_last_message_id__gte", models.F("summary_first_message_id")),
                    ),
                    _connector="OR",
                ),
                name="subtask_summary_job_shape",
            ),
        ),
        migrations.RunPython(create_summarizer, remove_summarizer),
    ]
