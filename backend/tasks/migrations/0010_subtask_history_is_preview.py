from django.db import migrations, models


def mark_spilled_turns(apps, schema_editor):
    # Until now a turn had an artifact only when its text spilled.
    Subtask = apps.get_model("tasks", "Subtask")
    Subtask.objects.filter(artifact__isnull=False).update(history_is_preview=True)


class Migration(migrations.Migration):
    dependencies = [
        ("tasks", "0009_subtask_message"),
    ]

    operations = [
        migrations.AddField(
            model_name="subtask",
            name="history_is_preview",
            field=models.BooleanField(default=False),
        ),
        migrations.RunPython(mark_spilled_turns, migrations.RunPython.noop),
    ]
