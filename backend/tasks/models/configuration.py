"""The bots that answer tasks, and the model table that sizes their prompts.

A `Bot` is a registered agent: which executor runs it and with which model, instructions,
permissions and limits. A `LanguageModel` row says what a model's context window, maximum output
and tokenizer are, so a bot's model decides how much prompt it gets (backend/dispatch/budgets.py).
"""

from __future__ import annotations

import re

from django.core.exceptions import ValidationError
from django.core.validators import MaxLengthValidator, MinValueValidator
from django.db import models
from django.db.models import F, Q

from backend import executor_kinds
from backend.prompting.inputs import validate_name
from backend.prompting.tokenizers import Tokenizer

DATED_SNAPSHOT = re.compile(r"-(?:\d{8}|\d{4}-\d{2}-\d{2})$")
"""A model name's dated snapshot suffix (`-20250929`, `-2025-04-14`)."""


INSTRUCTIONS_MAX_CHARS = 32_000


class PermissionMode(models.TextChoices):
    """What a bot's executor may do in its workspace."""

    FULL_ACCESS = "full_access", "Run commands and change files without asking"
    READ_ONLY = "read_only", "Read files only; no commands, no changes"


def validate_bot_name(value: str) -> None:
    """Bot names appear inside prompt role labels (`Assistant[reviewer]:`)."""
    try:
        validate_name(value)
    except ValueError as error:
        raise ValidationError(f"Bot name {error}.") from None


class Bot(models.Model):
    """A registered agent. Pipeline steps name bots; dispatch sends the bot's settings."""

    name = models.CharField(
        max_length=64,
        unique=True,
        validators=[validate_bot_name],
        help_text="Shown in prompts as Assistant[name] when a task has several bots.",
    )
    executor = models.CharField(max_length=32, choices=executor_kinds.CHOICES)
    model = models.CharField(
        max_length=200, blank=True, help_text="Model name the executor asks for; empty: its own."
    )
    # Executors take instructions as one command-line argument, which Linux caps at 128 KiB.
    instructions = models.TextField(
        blank=True,
        validators=[MaxLengthValidator(INSTRUCTIONS_MAX_CHARS)],
        help_text=f"The bot's system prompt (at most {INSTRUCTIONS_MAX_CHARS:,} characters).",
    )
    permission_mode = models.CharField(
        max_length=32, choices=PermissionMode.choices, default=PermissionMode.FULL_ACCESS
    )
    max_turns = models.PositiveIntegerField(
        null=True,
        blank=True,
        validators=[MinValueValidator(1)],
        help_text="Model round trips the executor may take for one turn. Empty: no limit.",
    )
    timeout_seconds = models.PositiveIntegerField(
        default=1800,
        validators=[MinValueValidator(1)],
        help_text="A turn running longer is stopped and fails with error code timeout.",
    )
    context_window = models.PositiveIntegerField(
        null=True,
        blank=True,
        help_text=(
            "The model's context window in tokens. Empty: the model table's figure for the "
            "bot's model."
        ),
    )
    # Learned from the executor's usage reports: the smallest (input tokens - the prompt's
    # tokens) seen for a turn run with a full prompt — what the executor's own system prompt
    # and tools take. Null until a turn reports usage (its kind's default_overhead_tokens apply).
    overhead_tokens = models.PositiveIntegerField(
        null=True,
        blank=True,
        help_text=(
            "Tokens the executor's own system prompt and tools take, learned from its usage "
            "reports (the smallest seen). Empty: a conservative default for the executor."
        ),
    )
    # Learned from the same reports (budgets.learn_token_ratio): the model's tokens per 1000
    # tokens Baton counts for its prompts, from a fit over the bot's recent full-prompt turns,
    # bounded on the safe side (prompting.tokenizers.fit_ratio). Null: the shipped factor.
    token_ratio_per_mille = models.PositiveIntegerField(
        null=True,
        blank=True,
        help_text=(
            "The model's tokens per 1000 tokens Baton counts, learned from usage reports of "
            "full prompts (never below a safe floor nor above the shipped estimate). Empty: "
            "the shipped estimate."
        ),
    )
    # Nullable without a default, like the field above: SQLite adds such a column in place,
    # keeping the table's configuration-version triggers (dispatch migration 0013).
    token_ratio_samples = models.PositiveIntegerField(
        null=True,
        blank=True,
        help_text="Full-prompt turns the token ratio was last fitted on. Empty: never fitted.",
    )
    is_default = models.BooleanField(
        default=False,
        help_text="The bot a task gets when it names only an executor (one per executor).",
    )
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        ordering = ["name"]
        constraints = [
            models.UniqueConstraint(
                fields=["executor"], condition=Q(is_default=True), name="bot_one_default_per_kind"
            ),
            models.CheckConstraint(
                condition=Q(executor__in=list(executor_kinds.NAMES)), name="bot_executor_valid"
            ),
            models.CheckConstraint(
                condition=Q(permission_mode__in=PermissionMode.values),
                name="bot_permission_mode_valid",
            ),
        ]

    def __str__(self) -> str:
        return f"{self.name} ({self.executor})"


class LanguageModel(models.Model):
    """One row of the model table: a model's window, maximum output and tokenizer.

    The project ships rows for the models the executors run (tasks migration 0013, figures
    from the providers' model documentation); the admin edits and extends them. A bot's model
    name finds its row exactly, or with a dated snapshot suffix removed
    (`claude-sonnet-4-5-20250929` → `claude-sonnet-4-5`, `gpt-4.1-2025-04-14` → `gpt-4.1`).
    """

    name = models.CharField(
        max_length=200, unique=True, help_text="The model name a bot asks for (its API id)."
    )
    provider = models.CharField(max_length=32, blank=True)
    context_window = models.PositiveIntegerField(
        validators=[MinValueValidator(1)],
        help_text="Tokens of input and output together, as the provider advertises it.",
    )
    max_output_tokens = models.PositiveIntegerField(
        validators=[MinValueValidator(1)], help_text="The most tokens one response may have."
    )
    max_input_tokens = models.PositiveIntegerField(
        null=True,
        blank=True,
        validators=[MinValueValidator(1)],
        help_text=(
            "The usable input when it is below the window less the output (a provider's input "
            "cap, or where an executor or the pricing makes more unusable). Empty: no such cap."
        ),
    )
    tokenizer = models.CharField(
        max_length=32,
        choices=[(tokenizer.value, tokenizer.value) for tokenizer in Tokenizer],
        help_text=(
            "o200k_base and cl100k_base are counted exactly; claude_3 (Claude 3 to Opus 4.6) "
            "and claude_4_7 (Opus 4.7 on) are counted with a calibrated safe-side estimate."
        ),
    )
    notes = models.TextField(blank=True, help_text="Where the figures come from, and caveats.")
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        ordering = ["name"]
        constraints = [
            models.CheckConstraint(
                condition=Q(tokenizer__in=[tokenizer.value for tokenizer in Tokenizer]),
                name="languagemodel_tokenizer_valid",
            ),
            models.CheckConstraint(
                condition=Q(max_output_tokens__lt=F("context_window")),
                name="languagemodel_output_within_window",
            ),
            models.CheckConstraint(
                condition=Q(max_input_tokens__isnull=True)
                | Q(max_input_tokens__lte=F("context_window") - F("max_output_tokens")),
                name="languagemodel_input_within_window",
            ),
        ]

    def __str__(self) -> str:
        return self.name

    @staticmethod
    def lookup_names(model: str) -> list[str]:
        """The names under which the table may list `model`: itself, then without a dated
        snapshot suffix."""
        undated = DATED_SNAPSHOT.sub("", model)
        return [model] if undated == model else [model, undated]
