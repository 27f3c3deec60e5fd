"""Baton's prompt builder core: plain typed inputs in, a bounded prompt and its report out.

This package imports nothing from Django (docs/architecture.md, principle 4). Modules, one idea
each:

* ``units`` — sizes in chars, bytes, approximate and real tokens; the one token counter.
* ``tokenizers`` — a model's tokens: exact with its own offline encoding, or a safe estimate.
* ``kinds`` — what an artifact's text is (JSON, command output, code, …), from a bounded sample.
* ``addressing`` — content addresses: the artifact id, workspace path and pointer of a text.
* ``truncate`` — head + tail cuts with Codex's exact markers; the previews ingestion stores.
* ``evidence`` — what a cut must keep from a text's middle: errors, tracebacks, URLs, titles.
* ``json_skeleton`` — a cut of a JSON text that is itself valid JSON.
* ``previews`` — every cut, kind-aware: JSON skeletons, evidence lines, line-bounded cuts.
* ``policy`` — :class:`PromptPolicy`, every cap, validated; :class:`ContextPassing`.
* ``inputs`` — the history, its summary, current message and previous result as frozen models.
* ``document`` — the structure of a prompt (sections, messages, omission notice).
* ``confusables`` — how a reader takes in a character: UTS #39 skeletons from Unicode's table.
* ``escaping`` — which content lines a reader would take for structure, and their escapes.
* ``render`` — labels, pointer lines, the notice; document → text.
* ``counting`` — exact token counts of a prompt's pieces, without encoding the prompt.
* ``pieces`` — a rendered message piece with its size, the unit every cap budgets.
* ``fixed`` — the Current Message and the Previous Result: cut at their caps, squeezed to fit.
* ``selection`` — which history messages fit, newest first, and the notice for the rest.
* ``summary`` — the summary block of omitted history, and the prompt of a summary job.
* ``tally`` — a build's pieces counted into its :class:`BuildReport`.
* ``build`` — :func:`build_prompt`: the sections put together under the caps, in their order.
* ``parse`` — :func:`parse_prompt`: text → document, the inverse of rendering.
* ``report`` — :class:`BuildReport`, counts and flags only, never prompt text.
* ``transcript`` — the whole conversation in the prompt's format, where the omission notice points.
* ``turn_files`` — each earlier turn's whole text as a file of its own, and their index.
"""

from backend.prompting.build import BUILDER_VERSION, PromptBudgetError, PromptBuild, build_prompt
from backend.prompting.counting import SEAM_SAFE_ENCODINGS
from backend.prompting.document import (
    OmissionNotice,
    ParsedPrompt,
    PromptDocument,
    RenderedMessage,
    RenderedSection,
    Section,
    SteerNote,
    SummaryBlock,
)
from backend.prompting.escaping import escape_content, unescape_content
from backend.prompting.inputs import (
    ArtifactPointer,
    CurrentMessage,
    HistoryMessage,
    HistorySummary,
    PromptInput,
    Role,
)
from backend.prompting.parse import PromptParseError, parse_prompt
from backend.prompting.policy import (
    CAP_RANGE,
    MAX_CAP,
    MIN_MAX_TOKENS,
    ContextPassing,
    PromptPolicy,
)
from backend.prompting.render import (
    omission_notice,
    pointer_line,
    render_document,
    role_label,
)
from backend.prompting.report import BuildReport, TruncatedMessage
from backend.prompting.truncate import (
    Preview,
    Truncation,
    make_preview,
    render_preview,
    truncate_middle,
    truncate_middle_with_count,
    truncation_marker,
)
from backend.prompting.turn_files import history_files_note, render_turn_index, turn_file_path
from backend.prompting.units import (
    APPROX_BYTES_PER_TOKEN,
    DEFAULT_TOKEN_ENCODING,
    Unit,
    UnknownEncodingError,
    count_tokens,
    load_encoding,
    measure,
)

__all__ = [
    "APPROX_BYTES_PER_TOKEN",
    "BUILDER_VERSION",
    "CAP_RANGE",
    "DEFAULT_TOKEN_ENCODING",
    "MAX_CAP",
    "MIN_MAX_TOKENS",
    "SEAM_SAFE_ENCODINGS",
    "ArtifactPointer",
    "BuildReport",
    "ContextPassing",
    "CurrentMessage",
    "HistoryMessage",
    "HistorySummary",
    "PromptPolicy",
    "OmissionNotice",
    "ParsedPrompt",
    "Preview",
    "PromptBudgetError",
    "PromptBuild",
    "PromptDocument",
    "PromptInput",
    "PromptParseError",
    "RenderedMessage",
    "SteerNote",
    "RenderedSection",
    "Role",
    "Section",
    "SummaryBlock",
    "TruncatedMessage",
    "Truncation",
    "Unit",
    "UnknownEncodingError",
    "build_prompt",
    "count_tokens",
    "escape_content",
    "history_files_note",
    "load_encoding",
    "make_preview",
    "measure",
    "omission_notice",
    "parse_prompt",
    "pointer_line",
    "render_document",
    "render_preview",
    "render_turn_index",
    "role_label",
    "truncate_middle",
    "truncate_middle_with_count",
    "truncation_marker",
    "turn_file_path",
    "unescape_content",
]
