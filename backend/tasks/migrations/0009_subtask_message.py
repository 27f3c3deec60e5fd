"""A USER turn's text is its `message`, as the API has always called it ("prompt" is what Baton
builds for an executor)."""

from django.db import migrations


class Migration(migrations.Migration):
    dependencies = [("tasks", "0008_subtask_created_at_from_the_round")]

    operations = [
        migrations.RenameField(model_name="subtask", old_name="prompt", new_name="message")
    ]
