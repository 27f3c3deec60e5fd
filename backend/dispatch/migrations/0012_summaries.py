"""History policies say whether and how omitted history is summarized; prompt reports name the
summary a prompt showed."""

from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [
        ("dispatch", "0011_budget_from_model_window"),
    ]

    operations = [
        migrations.AddField(
            model_name="historypolicy",
            name="summaries_enabled",
            field=models.BooleanField(
                default=False,
                help_text="Summarize omitted history: when prompts leave turns out, a summary job on the summary bot writes a rolling summary, which later prompts show after the omission notice. A dispatch never waits for it.",
            ),
        ),
        migrations.AddField(
            model_name="historypolicy",
            name="summary_bot",
            field=models.CharField(
                blank=True,
                help_text="The registered bot that writes summaries (its executor, model and keys stay on the workers). Required when summaries are on.",
                max_length=64,
                null=True,
            ),
        ),
        migrations.AddField(
            model_name="historypolicy",
            name="summary_max_chars",
            field=models.PositiveIntegerField(
                blank=True,
                default=4000,
                help_text="A summary longer than this is cut head + tail in the prompt (its full text stays stored). Not counted against max chars; counted against max tokens, after the history messages. Empty: no cap.",
                null=True,
            ),
        ),
        migrations.AddField(
            model_name="historypolicy",
            name="summary_threshold_turns",
            field=models.PositiveIntegerField(
                default=20,
                help_text="A new summary job is scheduled when this many omitted turns are not covered by a summary yet; it folds the previous summary in.",
            ),
        ),
        migrations.AddField(
            model_name="promptreport",
            name="summary_first_message_id",
            field=models.PositiveIntegerField(blank=True, null=True),
        ),
        migrations.AddField(
            model_name="promptreport",
            name="summary_last_message_id",
            field=models.PositiveIntegerField(blank=True, null=True),
        ),
        migrations.AddField(
            model_name="promptreport",
            name="summary_tokens",
            field=models.PositiveIntegerField(default=0),
        ),
    ]
