"""The JSON-RPC lines Baton writes to `codex app-server` and how it reads the lines it gets back.

`codex app-server` speaks JSON-RPC 2.0 over stdio, one JSON object per line, without the
`"jsonrpc"` member. Baton is the client: it sends requests (`id` and `method`) and one
notification (`method` only), and reads responses (`id` with `result` or `error`),
notifications, and requests the server makes of it (approvals and the like), which must be
answered or the turn waits on them. The method and field names are those of Codex 0.163
(`codex app-server generate-json-schema` prints the pinned version's protocol).

Pure: builds and reads plain data, no I/O.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

# Baton's name towards Codex; Codex puts it in the user agent of its model requests.
CLIENT_NAME = "baton"
CLIENT_VERSION = "1"

# The requests a run makes, by their fixed ids; steers take the ids after these.
INITIALIZE_ID = 0
THREAD_ID = 1  # thread/start or thread/resume
TURN_ID = 2  # turn/start
FIRST_STEER_ID = 3

# Server requests Baton declines, with the decline each one's schema accepts; every other
# server request gets a JSON-RPC error. With approval policy "never" Codex sends none of them.
_DECLINES: dict[str, dict[str, Any]] = {
    "item/commandExecution/requestApproval": {"decision": "decline"},
    "item/fileChange/requestApproval": {"decision": "decline"},
    "execCommandApproval": {"decision": "denied"},
    "applyPatchApproval": {"decision": "denied"},
}
_METHOD_NOT_FOUND = -32601


@dataclass(frozen=True)
class Incoming:
    """One line from the server: a response, a notification, or a request to Baton."""

    kind: str  # "response", "notification" or "request"
    id: Any = None  # a response's or a server request's id
    method: str = ""  # a notification's or a server request's method
    params: Any = None
    result: Any = None  # a successful response's result
    error: Any = None  # an error response's error object (None on success)


def read_line(line: str) -> Incoming | None:
    """The message on `line`, or None for anything that is not a JSON-RPC object."""
    try:
        message = json.loads(line)
    except (ValueError, RecursionError):  # not JSON, a truncated last line, absurd nesting
        return None
    if not isinstance(message, dict):
        return None
    method, params = message.get("method"), message.get("params")
    if isinstance(method, str):
        if "id" in message:
            return Incoming("request", id=message["id"], method=method, params=params)
        return Incoming("notification", method=method, params=params)
    if "id" in message and ("result" in message or "error" in message):
        return Incoming(
            "response", id=message["id"], result=message.get("result"), error=message.get("error")
        )
    return None


def encode(message: dict[str, Any]) -> bytes:
    """One message as the line the server reads (UTF-8, non-ASCII kept as it is)."""
    return (json.dumps(message, ensure_ascii=False, separators=(",", ":")) + "\n").encode()


def request(request_id: int, method: str, params: dict[str, Any]) -> bytes:
    return encode({"id": request_id, "method": method, "params": params})


def handshake() -> bytes:
    """`initialize` and the `initialized` notification the server waits for before any other
    request on the connection."""
    initialize = request(
        INITIALIZE_ID,
        "initialize",
        {
            "clientInfo": {"name": CLIENT_NAME, "title": None, "version": CLIENT_VERSION},
            "capabilities": None,
        },
    )
    return initialize + encode({"method": "initialized"})


def thread_settings(workspace: Path, permission_mode: str) -> dict[str, Any]:
    """The `thread/start` and `thread/resume` fields for the workspace and permission mode.

    full_access: no sandbox and no approvals (commands run as the worker's user). read_only:
    Codex's bwrap sandbox (shipped in the wheel): commands may read anything but write nowhere
    and have no network; apply_patch is rejected; approval "never" turns a request to escalate
    into a refusal the model sees. Any other mode (launch refuses them) gets read_only.
    """
    sandbox = "danger-full-access" if permission_mode == "full_access" else "read-only"
    return {"cwd": str(workspace), "sandbox": sandbox, "approvalPolicy": "never"}


def text_input(text: str) -> list[dict[str, Any]]:
    """`text` as a turn's user input: one text part, as the model receives it."""
    return [{"type": "text", "text": text, "text_elements": []}]


def reply_to(incoming: Incoming) -> bytes:
    """The answer to a server request: a decline for an approval, an error for the rest."""
    decline = _DECLINES.get(incoming.method)
    if decline is not None:
        return encode({"id": incoming.id, "result": decline})
    error = {"code": _METHOD_NOT_FOUND, "message": f"Baton does not answer {incoming.method}"}
    return encode({"id": incoming.id, "error": error})


def error_message(error: Any) -> str:
    """The text of a JSON-RPC error object (or of a turn's error)."""
    if isinstance(error, dict):
        message = error.get("message")
        if isinstance(message, str) and message:
            return message
    return "codex answered with an error"
