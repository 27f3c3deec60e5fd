from django.db import migrations, models


class Migration(migrations.Migration):
    """Transcript parts of two lengths: every part stored so far is a long one (128 turns)."""

    dependencies = [("tasks", "0023_transcript_parts")]

    operations = [
        migrations.RemoveConstraint(model_name="transcriptpart", name="transcript_part_number"),
        migrations.AddField(
            model_name="transcriptpart",
            name="span",
            field=models.PositiveIntegerField(default=128),
            preserve_default=False,
        ),
        migrations.AlterModelOptions(
            name="transcriptpart", options={"ordering": ["task_id", "-span", "number"]}
        ),
        migrations.AddConstraint(
            model_name="transcriptpart",
            constraint=models.UniqueConstraint(
                fields=("task", "span", "number"), name="transcript_part_span_number"
            ),
        ),
    ]
