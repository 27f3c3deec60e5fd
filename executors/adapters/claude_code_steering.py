"""What Baton writes to Claude Code's stdin in stream-json input mode, and the steers it tracks.

Claude Code 2.1.332 run with `--input-format stream-json` reads one JSON user message per stdin
line and exits once stdin is closed and its work is done; it never waits for input it has not
been sent (the 3 s "no stdin data received" wait is text input mode's). The prompt is the
first line; each steer is another one.

What Claude Code did with a user message written while a turn ran (seen with the stand-in):
- A message with a `uuid` is answered at once on stdout by `{"type":"command_lifecycle",
  "command_uuid":<uuid>,"state":"queued"}`; that is when a steer counts as delivered.
- Written during a tool call, it is drained into the same turn when the tool ends (`state:
  "started"`, and with `--replay-user-messages` an echo of it): the next model request carries
  it once, appended to the tool result's text in a `<system-reminder>` ("The user sent a new
  message while you were working: …"). The turn still ends with a single `result`.
- Written while the turn's last model call was under way, it waits: that turn's `result` comes
  first, then the message starts a turn of its own (`started` after that `result`) whose first
  model request ends with it as a user text block, and a second `result` follows. `modelUsage`
  and `total_cost_usd` in it are totals for the process, so they already include the first.

So the run's last `result` is the one after which no written steer still waits to start a
turn: only then is stdin closed, and from then on a steer is refused as FINISHED. (Claude Code
still ran a queued message's turn, or a background subagent's, after stdin closed; keeping stdin
open until then is what lets a steer written during that turn reach it.) The frames used here
are marked internal in Claude Code's schema: a version without them leaves steers unconfirmed
and stdin open, which the steering tests catch.
"""

from __future__ import annotations

import json
import threading
import uuid
from collections.abc import Callable

from executors.adapters.base import Stdin, SteerRefusal, SteerResult

# `command_lifecycle` states after which a message will never reach the model.
_DROPPED_STATES = frozenset({"cancelled", "discarded", "refused"})


def user_message_line(text: str, *, message_uuid: str | None = None) -> bytes:
    """One stream-json input line: a user message with `text` (and `message_uuid`, which makes
    Claude Code report the message's `command_lifecycle`).

    JSON escapes every newline, so a text of any length is one line. A lone surrogate cannot be
    UTF-8: it becomes "?" rather than failing the run.
    """
    message: dict[str, object] = {
        "type": "user",
        "message": {"role": "user", "content": text},
        "parent_tool_use_id": None,
        "session_id": "",
    }
    if message_uuid is not None:
        message["uuid"] = message_uuid
    line = json.dumps(message, ensure_ascii=False) + "\n"
    return line.encode("utf-8", errors="replace")


class ClaudeCodeSteering:
    """The steers of one run, from their write to stdin until Claude Code takes them in, and
    the moment stdin closes.

    Thread-safe: `steer` comes from the worker's heartbeat thread while the run's thread feeds
    lines. Every `done` is called exactly once, never while the lock is held.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._stdin: Stdin | None = None
        # Written to stdin, not yet reported `queued`: each steer's `done`.
        self._unconfirmed: dict[str, Callable[[SteerResult], None]] = {}
        # Written to stdin, not yet taken into a turn (`started`): another turn will follow.
        self._unstarted: set[str] = set()
        self._after_result = False  # a result was seen and no steer started a turn since
        self._finished = False  # the run's last result was seen: stdin is closed
        self._ended = False  # the process has exited

    def attach(self, stdin: Stdin) -> None:
        with self._lock:
            self._stdin = stdin

    def steer(self, text: str, done: Callable[[SteerResult], None]) -> None:
        """Write `text` as another user message; `done` hears when Claude Code queued it."""
        message_uuid = str(uuid.uuid4())
        with self._lock:
            refusal = self._refusal()
            # Written under the lock: the last result cannot close stdin between the check
            # and the write, and a written steer keeps stdin open until it has started a turn.
            if refusal is None:
                stdin = self._stdin
                assert stdin is not None  # _refusal() says NOT_RUNNING without one
                if stdin.write_stdin(user_message_line(text, message_uuid=message_uuid)):
                    self._unconfirmed[message_uuid] = done
                    self._unstarted.add(message_uuid)
                    return
                refusal = SteerRefusal.NOT_RUNNING  # stdin closed under us: the process ended
        done(SteerResult.refused(refusal))

    def lifecycle(self, command_uuid: str, state: str) -> None:
        """Claude Code's `command_lifecycle` frame for a message; only steers count."""
        with self._lock:
            if command_uuid not in self._unstarted:
                return  # not a steer, or one already taken into a turn (or dropped)
            if state in _DROPPED_STATES:
                result: SteerResult | None = SteerResult.refused(SteerRefusal.REFUSED)
                self._unstarted.discard(command_uuid)
            elif state in ("queued", "started"):
                # `started` without `queued` before it would still mean the steer was taken.
                result = SteerResult(delivered=True)
                if state == "started":
                    self._unstarted.discard(command_uuid)
                    # Taken into a turn: if one of its own, that turn's result is yet to come.
                    self._after_result = False
            else:
                return
            done = self._unconfirmed.pop(command_uuid, None)
            stdin = self._close_if_last()
        if stdin is not None:
            stdin.close_stdin()
        if done is not None and result is not None:
            done(result)

    def result_seen(self) -> None:
        """A `result` line ended a turn: close stdin if it was the run's last."""
        with self._lock:
            self._after_result = True
            stdin = self._close_if_last()
        if stdin is not None:
            stdin.close_stdin()

    def run_ended(self) -> None:
        """The process has exited: every steer not yet queued never will be."""
        with self._lock:
            self._ended = True
            unconfirmed = list(self._unconfirmed.values())
            self._unconfirmed.clear()
            self._unstarted.clear()
        for done in unconfirmed:
            done(SteerResult.refused(SteerRefusal.NOT_RUNNING))

    def _refusal(self) -> SteerRefusal | None:
        if self._finished:
            return SteerRefusal.FINISHED
        if self._ended or self._stdin is None:
            return SteerRefusal.NOT_RUNNING
        return None

    def _close_if_last(self) -> Stdin | None:
        """The stdin to close now (the caller closes it after releasing the lock), if the last
        result was seen and no steer waits for a turn of its own."""
        if self._finished or not self._after_result or self._unstarted:
            return None
        self._finished = True
        return self._stdin
