"""Steering a running Codex turn: `turn/steer` requests and what became of each.

A steer may come from another thread at any time: before the turn is open, while it runs,
after it ended. This keeps each steer's state under one lock and calls its `done` exactly
once, never while holding the lock:

- before the turn is open (`turn/started` not seen yet) a steer is held and sent as soon as it
  is: Codex refuses a steer in the short gap between the `turn/start` response and the turn
  really starting ("no active turn to steer");
- a sent steer carries the turn id as `expectedTurnId` and a `clientUserMessageId` of its own;
  a success response means Codex queued the text into the running turn, and Codex then records
  it as a `userMessage` item with that client id and sends it, as a user message after what the
  turn already has, in the turn's next model request (verified with 0.163: also when the steer
  lands during a tool command, and after the model's last answer had already arrived — the turn
  then makes one more model request);
- an error response is REFUSED, or FINISHED when it says the turn is no longer active;
- a success response read after the turn's `turn/completed`, without its `userMessage` item,
  is FINISHED: the turn ended without taking it;
- whatever is still unanswered when the run ends is NOT_RUNNING.

This object also owns writing to the app-server's stdin, so that a steer's line and the run's
own lines never interleave and nothing is written after stdin is closed.
"""

from __future__ import annotations

import threading
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field

from executors.adapters import codex_rpc
from executors.adapters.base import Stdin, SteerRefusal, SteerResult

# Codex's words (JSON-RPC -32600) for a steer that came too late or for another turn.
_TURN_GONE_PHRASES = ("no active turn", "expected active turn id")

Done = Callable[[SteerResult], None]


@dataclass
class _Steer:
    text: str
    done: Done
    client_id: str = field(default_factory=lambda: f"baton-steer-{uuid.uuid4().hex}")


@dataclass
class TurnSteering:
    """The stdin of one app-server run and the steers of its one turn."""

    _lock: threading.Lock = field(default_factory=threading.Lock)
    _stdin: Stdin | None = None
    _closed: bool = False
    _thread_id: str = ""
    _turn_id: str = ""
    _open: bool = False  # turn/started seen: steers are sent at once
    _over: bool = False  # turn/completed seen (or the turn never started)
    _ended: bool = False  # the run is over (`end`)
    _held: list[_Steer] = field(default_factory=list)
    _sent: dict[int, _Steer] = field(default_factory=dict)
    _seen: set[str] = field(default_factory=set)  # client ids of recorded userMessage items
    _delivered: list[_Steer] = field(default_factory=list)
    _next_id: int = codex_rpc.FIRST_STEER_ID

    # -- the run's own writing (its thread) ------------------------------------------------

    def attach(self, stdin: Stdin) -> None:
        with self._lock:
            self._stdin = stdin

    def write(self, data: bytes) -> None:
        with self._lock:
            if self._stdin is not None and not self._closed:
                self._stdin.write_stdin(data)

    def close_when_settled(self) -> None:
        """Close stdin (the app-server then exits) once the turn is over and every steer
        sent has its answer; called again after each answer."""
        with self._lock:
            if not self._over or self._sent or self._closed or self._stdin is None:
                return
            self._closed = True
            stdin = self._stdin
        stdin.close_stdin()

    def close(self) -> None:
        """Close stdin now: the run cannot go on (a request of its own failed)."""
        with self._lock:
            self._over = True
            if self._closed or self._stdin is None:
                return
            self._closed = True
            stdin = self._stdin
        stdin.close_stdin()

    # -- steers (any thread) ---------------------------------------------------------------

    def steer(self, text: str, done: Done) -> None:
        steer = _Steer(text, done)
        with self._lock:
            if self._ended:
                refusal: SteerRefusal | None = SteerRefusal.NOT_RUNNING
            elif self._over:
                refusal = SteerRefusal.FINISHED
            elif not self._open:
                self._held.append(steer)
                return
            else:
                refusal = self._send(steer)
        if refusal is not None:
            done(SteerResult.refused(refusal))

    def _send(self, steer: _Steer) -> SteerRefusal | None:
        """Write one steer (the lock held); the refusal when it cannot be written."""
        if self._stdin is None or self._closed:
            return SteerRefusal.NOT_RUNNING
        request_id = self._next_id
        self._next_id += 1
        line = codex_rpc.request(
            request_id,
            "turn/steer",
            {
                "threadId": self._thread_id,
                "expectedTurnId": self._turn_id,
                "clientUserMessageId": steer.client_id,
                "input": codex_rpc.text_input(steer.text),
            },
        )
        if not self._stdin.write_stdin(line):
            return SteerRefusal.NOT_RUNNING
        self._sent[request_id] = steer
        return None

    # -- what the run reads (its thread) ---------------------------------------------------

    def turn_started(self, *, thread_id: str, turn_id: str) -> None:
        """The turn is open: send the steers held until now."""
        refused: list[tuple[_Steer, SteerRefusal]] = []
        with self._lock:
            if self._open or self._over:
                return
            self._thread_id, self._turn_id, self._open = thread_id, turn_id, True
            held, self._held = self._held, []
            for steer in held:
                refusal = self._send(steer)
                if refusal is not None:
                    refused.append((steer, refusal))
        for steer, refusal in refused:
            steer.done(SteerResult.refused(refusal))

    def user_message(self, client_id: str) -> None:
        """Codex recorded a user message with this client id into the turn's history."""
        with self._lock:
            self._seen.add(client_id)

    def turn_completed(self) -> None:
        """The turn ended: held steers never went out."""
        with self._lock:
            self._over = True
            held, self._held = self._held, []
        for steer in held:
            steer.done(SteerResult.refused(SteerRefusal.FINISHED))

    def answered(self, request_id: object, error: object) -> bool:
        """A response to a steer (False when `request_id` is not one): settle it."""
        with self._lock:
            if not isinstance(request_id, int):
                return False
            steer = self._sent.pop(request_id, None)
            if steer is None:
                return False
            if error is not None:
                message = codex_rpc.error_message(error).lower()
                gone = any(phrase in message for phrase in _TURN_GONE_PHRASES)
                result = SteerResult.refused(
                    SteerRefusal.FINISHED if gone else SteerRefusal.REFUSED
                )
            elif self._over and steer.client_id not in self._seen:
                result = SteerResult.refused(SteerRefusal.FINISHED)
            else:
                self._delivered.append(steer)
                result = SteerResult(delivered=True)
        steer.done(result)
        return True

    def lost_deliveries(self) -> int:
        """Steers answered as delivered whose text the turn never recorded (not seen with
        0.163; reported as a warning if it ever happens)."""
        with self._lock:
            return sum(1 for steer in self._delivered if steer.client_id not in self._seen)

    def end(self) -> None:
        """The run is over: every steer still unanswered did not reach a running agent."""
        with self._lock:
            self._over = self._ended = self._closed = True
            left = self._held + list(self._sent.values())
            self._held, self._sent = [], {}
        for steer in left:
            steer.done(SteerResult.refused(SteerRefusal.NOT_RUNNING))
