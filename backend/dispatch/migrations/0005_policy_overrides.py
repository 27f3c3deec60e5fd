"""Rows set only the fields they mean to set; the rest is inherited per field.

The shipped rows that nobody has changed (version 1) set only what differs from the built-in
defaults: the default row and `code` set nothing, `chat` sets its smaller message and character
caps. So EXECUTOR_HISTORY_* environment settings take effect again under them. Every other row
was written by an operator and keeps every value it holds.
"""

from django.db import migrations, models

POLICY_FIELDS = [
    "enabled",
    "max_messages",
    "max_chars",
    "per_message_max_chars",
    "max_tokens",
    "token_encoding",
    "keep_first_user_message",
    "previous_result_max_chars",
    "current_message_max_chars",
    "context_passing",
    "resume_native_sessions",
    "resume_max_context_fraction",
]
SHIPPED_OVERRIDES = {"": [], "code": [], "chat": ["max_messages", "max_chars"]}


def set_overrides(apps, schema_editor):
    HistoryPolicy = apps.get_model("dispatch", "HistoryPolicy")
    for row in HistoryPolicy.objects.all():
        shipped = row.version == 1 and row.updated_by_id is None
        if shipped and row.task_type in SHIPPED_OVERRIDES:
            row.overrides = SHIPPED_OVERRIDES[row.task_type]
        else:
            row.overrides = POLICY_FIELDS
        row.save(update_fields=["overrides"])


class Migration(migrations.Migration):
    dependencies = [("dispatch", "0004_resume_prompts")]

    operations = [
        migrations.AddField(
            model_name="historypolicy",
            name="overrides",
            field=models.JSONField(
                blank=True,
                default=list,
                editable=False,
                help_text="The fields this row sets; the others are inherited.",
            ),
        ),
        migrations.RunPython(set_overrides, migrations.RunPython.noop),
    ]
