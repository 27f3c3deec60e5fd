"""The model table, with rows for the models the executors run, and what a bot's executor adds.

The figures are the providers' own (OpenAI's model pages, Anthropic's models overview):
the advertised context window, the most output tokens one response may have, and, where the
usable input is below the window less the output, that input limit. The admin edits and extends
the table; Baton counts OpenAI models exactly with o200k_base and Claude with a calibrated
estimate (backend/prompting/tokenizers.py).
"""

import django.core.validators
import django.db.models.expressions
from django.db import migrations, models

GPT_5_INPUT = (
    "The 400,000-token window is 272,000 tokens of input and 128,000 of output (reasoning "
    "included): the input is capped at 272,000."
)
GPT_5_LONG = (
    "Advertised window 1,050,000 tokens. Input above 272,000 tokens is billed as long context "
    "(twice the input price, 1.5 times the output price, for the whole request), and Codex CLI "
    "0.163, the codex executor, runs this model with a 272,000-token window: the usable input "
    "is 272,000."
)
O_SERIES = "200,000 tokens of input and output together; reasoning tokens count as output."
GPT_4_1 = "1,047,576 tokens of input and output together; no separate input cap."
GPT_4O = "128,000 tokens of input and output together."
CLAUDE_200K = "200,000 tokens of input and output together (extended thinking counts as output)."
CLAUDE_200K_1M_BETA = (
    CLAUDE_200K + " 1,000,000 only with the context-1m beta header, which the executors do "
    "not send."
)
CLAUDE_1M = "1,000,000 tokens of input and output together."

# name, provider, context window, max output, max input (None: window less output), tokenizer, notes
SHIPPED = [
    ("gpt-4o", "openai", 128_000, 16_384, None, "o200k_base", GPT_4O),
    ("gpt-4o-mini", "openai", 128_000, 16_384, None, "o200k_base", GPT_4O),
    ("gpt-4.1", "openai", 1_047_576, 32_768, None, "o200k_base", GPT_4_1),
    ("gpt-4.1-mini", "openai", 1_047_576, 32_768, None, "o200k_base", GPT_4_1),
    ("gpt-4.1-nano", "openai", 1_047_576, 32_768, None, "o200k_base", GPT_4_1),
    ("o1", "openai", 200_000, 100_000, None, "o200k_base", O_SERIES),
    ("o3", "openai", 200_000, 100_000, None, "o200k_base", O_SERIES),
    ("o3-mini", "openai", 200_000, 100_000, None, "o200k_base", O_SERIES),
    ("o3-pro", "openai", 200_000, 100_000, None, "o200k_base", O_SERIES),
    ("o4-mini", "openai", 200_000, 100_000, None, "o200k_base", O_SERIES),
    ("gpt-5", "openai", 400_000, 128_000, 272_000, "o200k_base", GPT_5_INPUT),
    ("gpt-5-mini", "openai", 400_000, 128_000, 272_000, "o200k_base", GPT_5_INPUT),
    ("gpt-5-nano", "openai", 400_000, 128_000, 272_000, "o200k_base", GPT_5_INPUT),
    ("gpt-5-codex", "openai", 400_000, 128_000, 272_000, "o200k_base", GPT_5_INPUT),
    ("gpt-5.1", "openai", 400_000, 128_000, 272_000, "o200k_base", GPT_5_INPUT),
    ("gpt-5.1-codex", "openai", 400_000, 128_000, 272_000, "o200k_base", GPT_5_INPUT),
    ("gpt-5.1-codex-mini", "openai", 400_000, 128_000, 272_000, "o200k_base", GPT_5_INPUT),
    ("gpt-5.1-codex-max", "openai", 400_000, 128_000, 272_000, "o200k_base", GPT_5_INPUT),
    ("gpt-5.2", "openai", 400_000, 128_000, 272_000, "o200k_base", GPT_5_INPUT),
    ("gpt-5.4", "openai", 1_050_000, 128_000, 272_000, "o200k_base", GPT_5_LONG),
    ("gpt-5.5", "openai", 1_050_000, 128_000, 272_000, "o200k_base", GPT_5_LONG),
    ("claude-opus-4", "anthropic", 200_000, 32_000, None, "claude_3", CLAUDE_200K),
    ("claude-opus-4-1", "anthropic", 200_000, 32_000, None, "claude_3", CLAUDE_200K),
    ("claude-opus-4-5", "anthropic", 200_000, 64_000, None, "claude_3", CLAUDE_200K),
    ("claude-opus-4-6", "anthropic", 1_000_000, 128_000, None, "claude_3", CLAUDE_1M),
    ("claude-opus-4-7", "anthropic", 1_000_000, 128_000, None, "claude_4_7", CLAUDE_1M),
    ("claude-sonnet-4", "anthropic", 200_000, 64_000, None, "claude_3", CLAUDE_200K_1M_BETA),
    ("claude-sonnet-4-5", "anthropic", 200_000, 64_000, None, "claude_3", CLAUDE_200K_1M_BETA),
    ("claude-sonnet-4-6", "anthropic", 1_000_000, 64_000, None, "claude_3", CLAUDE_1M),
    ("claude-haiku-4-5", "anthropic", 200_000, 64_000, None, "claude_3", CLAUDE_200K),
]
"""A dated snapshot (`claude-sonnet-4-5-20250929`, `claude-opus-4-20250514`) finds its row
with the date removed."""


def create_shipped_models(apps, schema_editor):
    LanguageModel = apps.get_model("tasks", "LanguageModel")
    for name, provider, window, output, max_input, tokenizer, notes in SHIPPED:
        LanguageModel.objects.get_or_create(
            name=name,
            defaults={
                "provider": provider,
                "context_window": window,
                "max_output_tokens": output,
                "max_input_tokens": max_input,
                "tokenizer": tokenizer,
                "notes": notes,
            },
        )


def remove_shipped_models(apps, schema_editor):
    LanguageModel = apps.get_model("tasks", "LanguageModel")
    LanguageModel.objects.filter(name__in=[row[0] for row in SHIPPED]).delete()


class Migration(migrations.Migration):
    dependencies = [
        ("tasks", "0016_task_turn_index"),
    ]

    operations = [
        migrations.AddField(
            model_name="subtask",
            name="history_text_tokens_o200k",
            field=models.PositiveIntegerField(blank=True, null=True),
        ),
        migrations.AddField(
            model_name="bot",
            name="overhead_tokens",
            field=models.PositiveIntegerField(
                blank=True,
                help_text="Tokens the executor's own system prompt and tools take, learned from its usage reports (the smallest seen). Empty: a conservative default for the executor.",
                null=True,
            ),
        ),
        migrations.AlterField(
            model_name="bot",
            name="context_window",
            field=models.PositiveIntegerField(
                blank=True,
                help_text="The model's context window in tokens. Empty: the model table's figure for the bot's model.",
                null=True,
            ),
        ),
        migrations.CreateModel(
            name="LanguageModel",
            fields=[
                (
                    "id",
                    models.BigAutoField(
                        auto_created=True, primary_key=True, serialize=False, verbose_name="ID"
                    ),
                ),
                (
                    "name",
                    models.CharField(
                        help_text="The model name a bot asks for (its API id).",
                        max_length=200,
                        unique=True,
                    ),
                ),
                ("provider", models.CharField(blank=True, max_length=32)),
                (
                    "context_window",
                    models.PositiveIntegerField(
                        help_text="Tokens of input and output together, as the provider advertises it.",
                        validators=[django.core.validators.MinValueValidator(1)],
                    ),
                ),
                (
                    "max_output_tokens",
                    models.PositiveIntegerField(
                        help_text="The most tokens one response may have.",
                        validators=[django.core.validators.MinValueValidator(1)],
                    ),
                ),
                (
                    "max_input_tokens",
                    models.PositiveIntegerField(
                        blank=True,
                        help_text="The usable input when it is below the window less the output (a provider's input cap, or where an executor or the pricing makes more unusable). Empty: no such cap.",
                        null=True,
                        validators=[django.core.validators.MinValueValidator(1)],
                    ),
                ),
                (
                    "tokenizer",
                    models.CharField(
                        choices=[
                            ("o200k_base", "o200k_base"),
                            ("cl100k_base", "cl100k_base"),
                            ("claude_3", "claude_3"),
                            ("claude_4_7", "claude_4_7"),
                        ],
                        help_text="o200k_base and cl100k_base are counted exactly; claude_3 (Claude 3 to Opus 4.6) and claude_4_7 (Opus 4.7 on) are counted with a calibrated safe-side estimate.",
                        max_length=32,
                    ),
                ),
                (
                    "notes",
                    models.TextField(
                        blank=True, help_text="Where the figures come from, and caveats."
                    ),
                ),
                ("updated_at", models.DateTimeField(auto_now=True)),
            ],
            options={
                "ordering": ["name"],
                "constraints": [
                    models.CheckConstraint(
                        condition=models.Q(
                            (
                                "tokenizer__in",
                                ["o200k_base", "cl100k_base", "claude_3", "claude_4_7"],
                            )
                        ),
                        name="languagemodel_tokenizer_valid",
                    ),
                    models.CheckConstraint(
                        condition=models.Q(("max_output_tokens__lt", models.F("context_window"))),
                        name="languagemodel_output_within_window",
                    ),
                    models.CheckConstraint(
                        condition=models.Q(
                            ("max_input_tokens__isnull", True),
                            (
                                "max_input_tokens__lte",
                                django.db.models.expressions.CombinedExpression(
                                    models.F("context_window"), "-", models.F("max_output_tokens")
                                ),
                            ),
                            _connector="OR",
                        ),
                        name="languagemodel_input_within_window",
                    ),
                ],
            },
        ),
        migrations.RunPython(create_shipped_models, remove_shipped_models),
    ]
