"""The Agno executor's child process: one Agno agent run per process, reported as JSON lines.

Why a child process: Agno is a Python library, but the worker must be able to end a run (cancel,
timeout, shutdown) by killing its whole process tree, and one run's crash or memory must not take
the worker down. So `AgnoAdapter` starts ``python -P -m executors.agno_runner`` (``-P``: the
workspace, which is the cwd, must never shadow ``agno``, ``openai`` or ``executors``) and this
module turns Agno's `RunEvent` stream into the small line protocol of `agno_protocol`. The worker
imports nothing from here; Agno is imported after stdout has been taken away from it (see
"Stdout").

Stdout: Agno logs to ``sys.stdout`` when it is not a terminal, and tools may print. Before Agno is
imported the runner keeps a private duplicate of fd 1 for the protocol and points fd 1 at stderr,
so whatever else is printed lands on stderr. Agno's INFO logs (which echo shell commands) are
filtered out; its warnings and errors (provider error messages) stay on stderr.
"""

from __future__ import annotations

import json
import logging
import os
import shlex
import sys
import traceback
import uuid
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any, BinaryIO

from executors.agno_protocol import (
    CONTENT_DELTA,
    ERROR_MAX_TURNS,
    ERROR_SESSION_NOT_FOUND,
    EXIT_BAD_JOB,
    EXIT_COMPLETED,
    EXIT_FAILED,
    FILE_READING_TOOLS,
    FILE_WRITING_TOOLS,
    MAX_ARG_CHARS,
    RESULT_HEAD_CHARS,
    RUN_COMPLETED,
    RUN_ERROR,
    RUN_STARTED,
    SHELL_TOOL,
    TOOL_COMPLETED,
    TOOL_STARTED,
    BadJob,
    Job,
    LineWriter,
)


def main() -> int:
    protocol = _take_stdout()
    try:
        job = Job.decode(sys.stdin.buffer.read())
    except BadJob as error:
        print(f"agno_runner: bad job: {error}", file=sys.stderr)
        return EXIT_BAD_JOB
    _detach_stdin()
    home = os.environ.get("HOME")
    if home:
        # HOME is in the state dir; tool commands (git, caches) expect it to exist.
        Path(home).mkdir(parents=True, exist_ok=True)
    # Tool commands inherit os.environ: the key goes to the model object only.
    api_key = os.environ.pop("OPENAI_API_KEY", None)
    os.environ["AGNO_TELEMETRY"] = "false"
    try:
        return run(job, api_key=api_key, out=LineWriter(protocol))
    except Exception:  # noqa: BLE001 - the child's last word: any failure becomes an exit code
        traceback.print_exc()
        return EXIT_FAILED


def _take_stdout() -> BinaryIO:
    """Keep fd 1 for the protocol only; everything else written to stdout goes to stderr."""
    sys.stdout.flush()
    protocol_fd = os.dup(1)  # not inheritable: tool commands never see the protocol pipe
    os.dup2(2, 1)
    return os.fdopen(protocol_fd, "wb")


def _detach_stdin() -> None:
    # The job is read; tool commands must not find the (closed) job pipe on their stdin.
    devnull = os.open(os.devnull, os.O_RDONLY)
    os.dup2(devnull, 0)
    os.close(devnull)


def run(job: Job, *, api_key: str | None, out: LineWriter) -> int:
    """Run the job's turn on Agno, reporting on `out`; the process exit code."""
    # Imported here, after _take_stdout(): Agno binds its log handler to sys.stdout at import.
    from agno.agent import Agent
    from agno.db.base import SessionType
    from agno.db.json import JsonDb

    _quiet_agno_logging()
    workspace = Path(job.workspace).resolve()
    state_dir = Path(job.state_dir)
    session_id = job.resume_session_id or str(uuid.uuid4())
    # One JSON db directory per session: concurrent runs of other sessions never rewrite it.
    # (agno.db.sqlite would need SQLAlchemy, which is not among Baton's dependencies.)
    session_dir = state_dir / "sessions" / session_id
    db = JsonDb(db_path=str(session_dir))
    # is_dir() first: looking a session up in JsonDb creates its directory.
    if job.resume_session_id is not None and (
        not session_dir.is_dir()
        or db.get_session(session_id, session_type=SessionType.AGENT) is None
    ):
        out.emit(
            RUN_ERROR,
            error=f"no Agno session {session_id} in this worker's state directory",
            error_type=ERROR_SESSION_NOT_FOUND,
            **_failure_details(None),
            metrics=_metrics(None),
        )
        return EXIT_FAILED

    model = _observed_chat_model()(
        id=job.model,
        base_url=job.base_url,
        api_key=api_key,
        max_retries=job.max_retries,
    )
    agent = Agent(
        model=model,
        instructions=job.instructions or None,
        tools=_tools(workspace, job.permission_mode),
        # Agno's only limit on an agent's loop; the reporter enforces the rest (see RunReporter).
        tool_call_limit=job.max_turns,
        db=db,
        session_id=session_id,
        add_history_to_context=True,
        telemetry=False,
    )
    reporter = RunReporter(out, workspace=workspace, max_turns=job.max_turns)
    stream = agent.run(job.prompt, stream=True, stream_events=True, yield_run_output=True)
    try:
        reporter.follow(stream)
    finally:
        # Stops Agno at once when the reporter left early (max_turns). Agno annotates the
        # stream as an Iterator; it is a generator.
        stream.close()  # type: ignore[attr-defined]
    return reporter.finish(model_failure=getattr(model, "last_failure", None))


def _quiet_agno_logging() -> None:
    """Drop Agno's debug and info records (ShellTools logs each command at INFO)."""

    def warnings_and_up(record: logging.LogRecord) -> bool:
        return record.levelno >= logging.WARNING

    # A logger filter, not a level: every Agent run resets the "agno" logger's level to INFO.
    for name in ("agno", "agno-team", "agno-workflow"):
        logging.getLogger(name).addFilter(warnings_and_up)


def _observed_chat_model() -> type:
    """OpenAIChat that notes what its last failed model call's exception said.

    Agno's RunError event carries only the provider's message and a generic error type; the
    exception (and the openai exception it was raised from) carries the HTTP status, which
    classifies a failure more reliably than its wording. The details are taken when the call
    fails: for a non-retryable error Agno's retry loop then re-raises the same exception
    `from` itself, which replaces the openai exception in its `__cause__`.
    OpenAIChat, not OpenAIResponses: with streaming, OpenAIResponses ignores `response.failed`
    and reports success with empty content.
    """
    from agno.models.openai import OpenAIChat

    class ObservedOpenAIChat(OpenAIChat):
        def invoke_stream(self, *args: Any, **kwargs: Any) -> Iterator[Any]:
            try:
                yield from super().invoke_stream(*args, **kwargs)
            except Exception as error:
                self.last_failure = _failure_details(error)
                raise

    return ObservedOpenAIChat


def _tools(workspace: Path, permission_mode: str) -> list[Any]:
    """File tools rooted at the workspace always; writing and the shell only for full_access.

    Reading files is what makes Baton's artifact pointer lines (``.baton/artifacts/<id>.txt``)
    useful: without it Agno cannot read a spilled result.
    """
    from agno.tools.file.file import FileTools
    from agno.tools.shell import ShellTools

    if permission_mode == "read_only":
        return [
            FileTools(
                base_dir=workspace,
                enable_save_file=False,
                enable_replace_file_chunk=False,
                enable_delete_file=False,
            )
        ]
    return [FileTools(base_dir=workspace), ShellTools(base_dir=workspace)]


class RunReporter:
    """Follows one Agno event stream and writes the protocol lines for it.

    `max_turns` bounds the run twice: Agno's `tool_call_limit` refuses tool calls beyond it, but
    Agno then asks the model again for as long as it keeps calling tools (seen: unbounded). So the
    reporter also stops the run before model request number max_turns + 2 — one request per tool
    round plus the one that must answer — and reports `max_turns`.
    """

    def __init__(self, out: LineWriter, *, workspace: Path, max_turns: int | None) -> None:
        self._out = out
        self._workspace = workspace
        self._max_turns = max_turns
        self._max_requests = None if max_turns is None else max_turns + 1
        self._model_requests = 0
        self._usage: dict[str, int] = dict.fromkeys(_TOKEN_FIELDS, 0)
        self._existed_before: dict[str, bool] = {}  # call_id → did the target file exist
        self._error_event: Any = None
        self._run_output: Any = None
        self._turns_exhausted = False

    def follow(self, stream: Iterator[Any]) -> None:
        from agno.run.agent import RunEvent, RunOutput

        for item in stream:
            if isinstance(item, RunOutput):
                self._run_output = item
                continue
            kind = getattr(item, "event", None)
            if kind == RunEvent.run_started.value:
                self._out.emit(
                    RUN_STARTED,
                    session_id=item.session_id or "",
                    run_id=item.run_id or "",
                    model=item.model or "",
                )
            elif kind == RunEvent.run_content.value:
                if isinstance(item.content, str) and item.content:
                    self._out.emit(CONTENT_DELTA, text=item.content)
            elif kind == RunEvent.model_request_started.value:
                self._model_requests += 1
                if self._max_requests is not None and self._model_requests > self._max_requests:
                    self._turns_exhausted = True
                    return
            elif kind == RunEvent.model_request_completed.value:
                for name in _TOKEN_FIELDS:
                    self._usage[name] += getattr(item, name, None) or 0
            elif kind == RunEvent.tool_call_started.value:
                self._tool_started(item.tool)
            elif kind == RunEvent.tool_call_completed.value:
                self._tool_completed(item.tool)
            elif kind == RunEvent.run_error.value:
                self._error_event = item

    def finish(self, *, model_failure: dict[str, Any] | None) -> int:
        """Write the run's last line; the exit code. `model_failure`: the failed model call's
        `_failure_details`, if a model call failed."""
        from agno.run.base import RunStatus

        if self._turns_exhausted:
            self._error(
                f"max_turns ({self._max_turns}) ran out: the model kept calling tools after "
                f"{self._max_requests} model requests",
                error_type=ERROR_MAX_TURNS,
            )
            return EXIT_FAILED
        if self._error_event is not None:
            self._error(
                str(self._error_event.content or ""),
                error_type=self._error_event.error_type or "run_error",
                failure=model_failure,
            )
            return EXIT_FAILED
        output = self._run_output
        if output is not None and output.status == RunStatus.completed:
            self._out.emit(
                RUN_COMPLETED, content=_content_text(output.content), metrics=_metrics(output)
            )
            return EXIT_COMPLETED
        status = getattr(getattr(output, "status", None), "value", "none")
        error_type = {"CANCELLED": "run_cancelled", "PAUSED": "run_paused"}.get(
            status, "run_incomplete"
        )
        self._error(f"the Agno run ended with status {status}", error_type=error_type)
        return EXIT_FAILED

    def _error(self, text: str, *, error_type: str, failure: dict[str, Any] | None = None) -> None:
        self._out.emit(
            RUN_ERROR,
            error=text,
            error_type=error_type,
            **(failure or _failure_details(None)),
            metrics=dict(self._usage),
        )

    def _tool_started(self, tool: Any) -> None:
        call_id, name, args = _tool_identity(tool)
        if name in FILE_WRITING_TOOLS:
            target = self._target(args)
            if target is not None:
                self._existed_before[call_id] = target.exists()
        line: dict[str, Any] = {"call_id": call_id, "tool": name, "args": _bounded(args)}
        if name == SHELL_TOOL:
            line["command"] = shell_command(args)
        self._out.emit(TOOL_STARTED, **line)

    def _tool_completed(self, tool: Any) -> None:
        call_id, name, args = _tool_identity(tool)
        result = tool.result if isinstance(tool.result, str) else ""
        is_error = _tool_failed(name, args, result, bool(tool.tool_call_error))
        line: dict[str, Any] = {
            "call_id": call_id,
            "tool": name,
            "args": _bounded(args),
            "is_error": is_error,
            "result_chars": len(result),
            "result_head": result[:RESULT_HEAD_CHARS],
        }
        if name == SHELL_TOOL:
            line["command"] = shell_command(args)
            # ShellTools returns stdout only for exit status 0 and "Error: <stderr>" otherwise,
            # without the status: 0 is known, a failure's code is not.
            line["exit_code"] = None if is_error else 0
        if name in FILE_WRITING_TOOLS:
            target = self._target(args)
            files = []
            if target is not None and not is_error:
                existed = self._existed_before.pop(call_id, True)
                change = "update" if existed or name == "replace_file_chunk" else "add"
                files.append(
                    {"path": target.relative_to(self._workspace).as_posix(), "change": change}
                )
            line["files"] = files
        self._out.emit(TOOL_COMPLETED, **line)

    def _target(self, args: Mapping[str, Any]) -> Path | None:
        """The workspace file a file tool call names, resolved as FileTools resolves it."""
        from agno.exceptions import PathSecurityError
        from agno.utils.path_safety import safe_join_relative_path

        file_name = args.get("file_name")
        if not isinstance(file_name, str):
            return None
        try:
            return safe_join_relative_path(self._workspace, file_name)
        except (PathSecurityError, OSError, ValueError):
            return None


_TOKEN_FIELDS = (
    "input_tokens",
    "output_tokens",
    "cache_read_tokens",
    "cache_write_tokens",
    "reasoning_tokens",
)


def _tool_identity(tool: Any) -> tuple[str, str, dict[str, Any]]:
    args = tool.tool_args if isinstance(tool.tool_args, dict) else {}
    return tool.tool_call_id or "", tool.tool_name or "", args


def _tool_failed(name: str, args: Mapping[str, Any], result: str, call_error: bool) -> bool:
    """Whether a tool call failed. Agno's FileTools and ShellTools report most failures as their
    result text, not as a tool-call error, so their result conventions are read here."""
    if call_error:
        return True
    if name == SHELL_TOOL:
        return result.startswith("Error: ")
    if name in FILE_WRITING_TOOLS:
        return result != str(args.get("file_name"))  # both return the file name on success
    if name in FILE_READING_TOOLS:
        return result.startswith("Error reading file")
    return False


def _bounded(value: Any) -> Any:
    """`value` with every string longer than MAX_ARG_CHARS cut, for the protocol line only."""
    if isinstance(value, str):
        if len(value) <= MAX_ARG_CHARS:
            return value
        return f"{value[:MAX_ARG_CHARS]}…[{len(value) - MAX_ARG_CHARS} more characters]"
    if isinstance(value, Mapping):
        return {str(key): _bounded(item) for key, item in value.items()}
    if isinstance(value, list | tuple):
        return [_bounded(item) for item in value]
    if value is None or isinstance(value, bool | int | float):
        return value
    return str(value)


def shell_command(args: Mapping[str, Any]) -> str | None:
    """The command line of a ShellTools call: its `args` list, shell-quoted (not cut)."""
    argv = args.get("args")
    if isinstance(argv, list) and all(isinstance(part, str) for part in argv):
        return shlex.join(argv)
    if isinstance(argv, str):
        return argv
    return None


def _content_text(content: Any) -> str:
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    return json.dumps(content, ensure_ascii=False, default=str)


def _metrics(output: Any) -> dict[str, Any]:
    metrics = getattr(output, "metrics", None)
    data: dict[str, Any] = {name: getattr(metrics, name, 0) or 0 for name in _TOKEN_FIELDS}
    cost = getattr(metrics, "cost", None)
    if cost is not None:
        data["cost"] = float(cost)
    return data


def _failure_details(failure: BaseException | None) -> dict[str, Any]:
    """The HTTP status and network flag found on the exception chain of a failed model call."""
    import openai

    # openai wraps refused connections, timeouts and streams cut mid-answer in APIConnectionError
    # (APITimeoutError is one too); a bare transport error is caught in case one slips through.
    # openai 3.57 uses httpx2, Agno's other clients httpx.
    network_errors: tuple[type[BaseException], ...] = (openai.APIConnectionError,)
    for module_name in ("httpx2", "httpx"):
        module = sys.modules.get(module_name)
        if module is not None:
            network_errors += (module.TransportError,)
    http_status: int | None = None
    network_error = False
    link: BaseException | None = failure
    seen: set[int] = set()
    while link is not None and id(link) not in seen:
        seen.add(id(link))
        if isinstance(link, openai.APIStatusError):
            http_status = link.status_code
            break
        if isinstance(link, network_errors):
            network_error = True
            break
        link = link.__cause__ or link.__context__
    return {
        "http_status": http_status,
        "network_error": network_error,
        "exception": type(failure).__name__ if failure is not None else None,
    }


if __name__ == "__main__":
    sys.exit(main())
