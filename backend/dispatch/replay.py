"""Replaying a past dispatch: rebuild the exact prompt a PromptReport describes, and check it.

A report keeps no prompt text (docs/architecture.md, principle 7), but it keeps what rebuilds it:
the policy as it was resolved, the build input's turn ids, counts and flags, the context-passing
mode, the rendering rules' version and the sha256 of the prompt that was sent. The turns' texts
do not change once recorded, so building again from them under the recorded policy gives the
same bytes, whatever the policy rows say today. A replay says whether the sha256 matches, and
when it cannot match, why: a report from before replay existed, a turn since deleted, or other
rendering rules than the ones the prompt was built with.
"""

from __future__ import annotations

from dataclasses import dataclass

from pydantic import ValidationError

from backend.dispatch.models import PromptReport
from backend.prompting import BUILDER_VERSION, PromptBudgetError, PromptPolicy, build_prompt
from backend.prompting.addressing import content_sha256
from backend.tasks.history import HistoryUnavailable, prompt_input_from_snapshot
from backend.tasks.transcripts import transcript_for


@dataclass(frozen=True)
class Replay:
    report: PromptReport
    text: str
    """The rebuilt prompt ("" when it could not be rebuilt)."""
    sha256: str
    matches: bool
    """The rebuilt prompt is byte for byte the one recorded."""
    problem: str
    """Why the prompt could not be rebuilt, or could not be expected to match ("" if none)."""


def replay_prompt(*, report: PromptReport) -> Replay:
    """Rebuild the prompt `report` describes and compare its sha256 with the recorded one."""
    if not report.prompt_sha256 or not report.input_snapshot or not report.policy_snapshot:
        return _unreplayable(report, "this report was recorded before prompts could be replayed")
    try:
        policy = PromptPolicy.model_validate(report.policy_snapshot)
        snapshot = report.input_snapshot
        prompt_input = prompt_input_from_snapshot(task_id=report.task_id, snapshot=snapshot)
        if snapshot.get("transcript"):
            transcript = transcript_for(
                task_id=report.task_id,
                is_group_chat=prompt_input.is_group_chat,
                multi_bot=prompt_input.multi_bot,
                snapshot=snapshot["transcript"],
            )
            if transcript is None:
                raise HistoryUnavailable(
                    f"turns of task {report.task_id}'s transcript no longer exist"
                )
            prompt_input = prompt_input.with_transcript(transcript.pointer)
        build = build_prompt(prompt_input, policy, context_passing=report.context_passing)
    except HistoryUnavailable as error:
        return _unreplayable(report, str(error))
    except (ValidationError, PromptBudgetError, KeyError) as error:
        return _unreplayable(report, f"the recorded build no longer loads ({type(error).__name__})")
    sha256 = content_sha256(build.text)
    matches = sha256 == report.prompt_sha256
    problem = ""
    if not matches and report.builder_version != BUILDER_VERSION:
        problem = (
            f"built with rendering rules {report.builder_version}; "
            f"this Baton renders with {BUILDER_VERSION}"
        )
    return Replay(report=report, text=build.text, sha256=sha256, matches=matches, problem=problem)


def _unreplayable(report: PromptReport, problem: str) -> Replay:
    return Replay(report=report, text="", sha256="", matches=False, problem=problem)
