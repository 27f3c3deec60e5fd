"""`python -m executors.standin`: run the stand-in model server until SIGTERM or SIGINT.

Prints one line, ``Baton stand-in model listening on http://HOST:PORT``, once the port is bound,
so a script or test that started it with ``--port 0`` can read the URL from stdout.
"""

from __future__ import annotations

import argparse
import json
import signal
import sys
import threading
from pathlib import Path
from types import FrameType

from executors.standin.script import ScriptError
from executors.standin.server import ModelServer


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m executors.standin",
        description="Baton's stand-in model server (OpenAI Responses, Chat Completions, "
        "Anthropic Messages) for demos and tests.",
    )
    parser.add_argument("--host", default="127.0.0.1", help="address to bind (127.0.0.1)")
    parser.add_argument("--port", type=int, default=0, help="port to bind; 0 picks a free one")
    parser.add_argument("--script", type=Path, help="a JSON file with a list of scripted turns")
    parser.add_argument("--record", type=Path, help="also append every request to this JSONL file")
    parser.add_argument(
        "--max-prompt-tokens",
        type=int,
        help="refuse prompts over this many tokens (about four bytes each) with the API's "
        "context-length error, like a model with a small window",
    )
    return parser


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    server = ModelServer(args.host, args.port, record_path=args.record)
    if args.script is not None:
        try:
            server.set_turns(json.loads(args.script.read_text(encoding="utf-8")))
        except (OSError, json.JSONDecodeError, ScriptError) as error:
            print(f"cannot use the script {args.script}: {error}", file=sys.stderr)
            return 2
    if args.max_prompt_tokens is not None:
        server.set_context_limit(args.max_prompt_tokens)

    stop = threading.Event()

    def request_stop(signum: int, frame: FrameType | None) -> None:
        stop.set()

    signal.signal(signal.SIGTERM, request_stop)
    signal.signal(signal.SIGINT, request_stop)
    with server:
        print(f"Baton stand-in model listening on {server.url}", flush=True)
        stop.wait()
    return 0


if __name__ == "__main__":
    sys.exit(main())
