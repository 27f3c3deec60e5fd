"""Scenario: dispatch in process (no HTTP server), on a throwaway database.

- claims: `--claim-turns` pending turns (two answered rounds and one pending turn a task),
  then `--claim-workers` processes call `claim_turns` (claim, history window, prompt build,
  prompt report) `--limit` turns a call until none is left: claims per second over the drain,
  verified by counting (ids distinct, none lost, one prompt report each).
- cpu (PostgreSQL): one client dispatches `--dispatches` turns one at a time (`limit=1`; with
  `--cpu-report` each followed by its result report, naming a native session with
  `--native-sessions`), in blocks (`--blocks`), through Django's test client, nothing else
  running: the CPU of this process's Python and of its PostgreSQL backend per dispatch (from
  /proc), the blocks' minimum the steadiest figure, and the statements one dispatch sends.
  With `--cpu-http`, over HTTP to gunicorn (one sync worker) instead, against as many requests
  to the bare view (`/bench/ceiling/`, two small queries).
- history_files: a task of `--history-turns` earlier turns (~600-char answers, one in a hundred
  spilled) stored through the services; its next turn dispatched through the whole stack, rolled
  back each time: the first dispatch (every turn file written, every part sealed), then with and
  without the newest turns' files, alternated; then the worker's pass over a workspace that has
  every file (`materialize_artifacts`).
- transcripts: for conversations of `--transcript-rounds`, the next prompt built as dispatch
  builds it, alternated: with the transcript (read, rendered, escaped, stored, the prompt built
  again with its pointer) against without it (`find_transcript=False`).
"""

from __future__ import annotations

import argparse
import dataclasses
import multiprocessing
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench._django import bench_database  # noqa: E402
from bench._live import (  # noqa: E402
    cpu_seconds,
    live_baton,
    postgres_backends,
    server_cpu_seconds,
)
from bench._seed import pending_turns  # noqa: E402
from bench._suite import Measurement, Row, Scenario, at_least, at_most, results_of  # noqa: E402

# -- claims: concurrent workers draining the pending turns -----------------------------------


def _claiming_worker(index: int, limit: int, start_at: float, queue: Any) -> None:
    import django

    django.setup()
    from backend.dispatch.claims import claim_turns
    from backend.dispatch.workers import ensure_worker_account

    worker, _ = ensure_worker_account(username=f"bench-worker-{index}")
    while time.time() < start_at:
        time.sleep(0.001)
    claimed: list[int] = []
    while True:
        turns = claim_turns(worker=worker, worker_id=f"w{index}", kinds=["codex"], limit=limit)
        if not turns:
            break
        claimed.extend(turn.subtask.pk for turn in turns)
    queue.put((index, claimed, time.time()))


def measure_claims(args: argparse.Namespace) -> list[Row]:
    turns = args.claim_turns
    with bench_database(args.postgres) as vendor:
        from django.db import connection

        from backend.dispatch.models import PromptReport
        from backend.tasks.models import Subtask

        pending_turns(turns)
        connection.close()  # never share a connection with the worker processes
        if vendor == "postgresql":
            connection.close_pool()
        context = multiprocessing.get_context("fork")
        queue = context.Queue()
        start_at = time.time() + 2.0  # let every process set up, then start together
        processes = [
            context.Process(target=_claiming_worker, args=(index, args.limit, start_at, queue))
            for index in range(args.claim_workers)
        ]
        for process in processes:
            process.start()
        results = results_of(processes, queue)
        for process in processes:
            process.join()
        elapsed = max(result[2] for result in results) - start_at
        claimed = [subtask_id for _, ids, _ in results for subtask_id in ids]
        running = Subtask.objects.filter(status="RUNNING").count()
        reports = PromptReport.objects.count()
    twice = len(claimed) - len(set(claimed))
    lost = turns - len(set(claimed))
    wrong_rows = abs(running - turns) + abs(reports - turns)
    where = f"{vendor}, {args.claim_workers} workers, {args.limit} turns a call"
    return [
        Row(
            f"claims of {turns:,} turns ({where})",
            len(claimed) / elapsed,
            "claims/s",
            target=at_least(300),
        ),
        Row(
            "claimed twice, lost, or without their RUNNING row and prompt report",
            twice + lost + wrong_rows,
            "turns",
            target=at_most(0),
            note=f"twice {twice}, lost {lost}; {running} RUNNING, {reports} prompt reports",
        ),
    ]


# -- cpu: what one dispatch costs the server's Python and PostgreSQL ------------------------

# A request: (path, JSON body or None for a GET) -> (status, JSON answer or None).
Send = Callable[[str, dict[str, Any] | None], tuple[int, Any]]


@contextmanager
def _in_process(token: str) -> Iterator[tuple[Send, Callable[[], float]]]:
    from django.test import Client

    client = Client(HTTP_AUTHORIZATION=f"Token {token}", HTTP_HOST="127.0.0.1")

    def send(path: str, body: dict[str, Any] | None) -> tuple[int, Any]:
        answer = client.post(path, body, content_type="application/json")
        return answer.status_code, answer.json()

    yield send, time.process_time


@contextmanager
def _over_http() -> Iterator[tuple[Send, Callable[[], float]]]:
    import httpx
    from django.db import connection

    os.environ["DJANGO_SETTINGS_MODULE"] = "bench._ceiling_settings"  # the server's
    with live_baton(workers=1) as baton:
        connection.close()  # the seed's: the server's backends are every other one
        headers = {"Authorization": f"Token {baton.worker_token}"}
        with httpx.Client(base_url=baton.url, headers=headers, timeout=60) as client:

            def send(path: str, body: dict[str, Any] | None) -> tuple[int, Any]:
                answer = client.get(path) if body is None else client.post(path, json=body)
                return answer.status_code, answer.json() if body is not None else None

            yield send, lambda: server_cpu_seconds(baton.server_pid)


def _print_plans(connection: Any) -> None:
    """Each statement prepared on the connection, with the plans PostgreSQL made for it: a
    statement planned on every run ("custom") pays its planning each time."""
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT generic_plans, custom_plans, statement FROM pg_prepared_statements"
            " ORDER BY custom_plans DESC"
        )
        for generic, custom, statement in cursor.fetchall():
            print(f"  generic {generic:5} custom {custom:5}  {' '.join(statement.split())[:90]}")


def measure_cpu(args: argparse.Namespace) -> list[Row]:
    warm_up = 20
    per_block = args.dispatches // args.blocks
    blocks: dict[str, list[tuple[float, float]]] = {}
    statements = None
    what = "cycle (dispatch + report)" if args.cpu_report else "dispatch"
    with bench_database(args.postgres):
        from django.db import connection
        from django.test.utils import CaptureQueriesContext

        from backend.dispatch.workers import ensure_worker_account

        _, token = ensure_worker_account(username="bench-worker")
        pending_turns(per_block * args.blocks + warm_up + 1)
        target = _over_http() if args.cpu_http else _in_process(token)
        with target as (send, server_cpu):

            def cycle() -> None:
                status, answer = send(
                    "/api/executor/dispatch/",
                    {"worker_id": "cpu", "kinds": ["codex"], "limit": 1},
                )
                assert status == 200, answer
                turn = answer["turns"][0]
                if args.cpu_report:
                    session = {"native_session_id": f"session-{turn['subtask_id']}"}
                    status, reported = send(
                        f"/api/executor/subtasks/{turn['subtask_id']}/result/",
                        {
                            "worker_id": "cpu",
                            "attempt": turn["attempt"],
                            "status": "COMPLETED",
                            "result": {"value": "Done."},
                            **(session if args.native_sessions else {}),
                        },
                    )
                    assert status == 200, reported

            def bare() -> None:
                status, _ = send("/bench/ceiling/", None)
                assert status == 200

            for _ in range(warm_up):  # the token, the configuration, prepared statements
                cycle()
            if args.cpu_http:
                bare()
            else:
                with CaptureQueriesContext(connection) as queries:
                    cycle()
                statements = len(queries.captured_queries)
                if args.show_statements:
                    for query in queries.captured_queries:
                        print("  " + " ".join(query["sql"].split())[:150])
            backends = postgres_backends(other_than_mine=args.cpu_http)

            def measure(name: str, work: Callable[[], None]) -> None:
                for _ in range(args.blocks):
                    python = server_cpu()
                    before = cpu_seconds(backends)
                    for _ in range(per_block):
                        work()
                    python = (server_cpu() - python) / per_block * 1000
                    # Only the backends that served the whole block count.
                    after = cpu_seconds(backends)
                    spent = sum(after[pid] - before[pid] for pid in after.keys() & before.keys())
                    blocks.setdefault(name, []).append((python, spent / per_block * 1000))

            measure(what, cycle)
            if args.cpu_http:
                measure("bare view", bare)
            elif args.show_plans:
                _print_plans(connection)

    where = "over HTTP, gunicorn 1 sync worker" if args.cpu_http else "in process"
    counted = f"; {statements} statements a {what}" if statements is not None else ""

    def best(name: str, index: int) -> float:
        return min(block[index] for block in blocks[name])

    def note(name: str, index: int) -> str:
        listed = ", ".join(f"{block[index]:.2f}" for block in blocks[name])
        return f"minimum of {args.blocks} blocks of {per_block} ({listed}){counted}"

    baseline = "bare view" if args.cpu_http else None
    return [
        Row(
            f"{what} {where}: {part} CPU",
            best(what, index),
            "ms",
            baseline_name=baseline,
            baseline_value=best("bare view", index) if baseline else None,
            note=note(what, index),
        )
        for index, part in enumerate(("Python", "PostgreSQL"))
    ]


# -- history_files: a long conversation's dispatch with and without its turn files -----------

ANSWER = (
    "I ran the suite: 212 passed, 3 failed in tests/test_upload.py. The failures share a tmp dir;"
    " the cleanup of one test removes files another still reads. "
) * 4
LONG_ANSWER = "".join(f"build step {n:05d}: compiled module ok\n" for n in range(600))


def _answer(number: int) -> str:
    return f"{number}: {LONG_ANSWER}" if number % 100 == 99 else f"{number}: {ANSWER}"


class _LocalBackend:
    """The worker's downloads served from this process's artifact store (no HTTP): what the
    worker's first pass over a fresh workspace fetches."""

    def download(self, *, url: str, destination: Path, sha256: str) -> None:
        from backend.artifacts.models import Artifact
        from backend.artifacts.selectors import artifact_content

        artifact = Artifact.objects.get(pk=url.rstrip("/").split("/")[-2])
        destination.write_bytes(b"".join(artifact_content(artifact=artifact)))


def _worker_pass(turn: dict[str, Any]) -> float:
    """Lay the turn's manifest out in a fresh workspace (parts and lists included), then time
    (ms) the worker's next pass over it (every file present: hashed, nothing downloaded)."""
    from executors.payloads import ArtifactEntry, ArtifactPartRef
    from executors.workspace import materialize_artifacts, task_workspace

    workspace = task_workspace(root=Path(tempfile.mkdtemp(prefix="baton-bench-ws-")), task_id=1)
    manifest = {
        "manifest": [ArtifactEntry.model_validate(entry) for entry in turn["artifacts"]],
        "artifact_lists": [
            ArtifactPartRef.model_validate(listed) for listed in turn.get("artifact_lists", [])
        ],
        "artifact_url_template": turn.get("artifact_url_template", ""),
        "manifest_version": turn.get("manifest_version", 1),
    }
    materialize_artifacts(client=_LocalBackend(), workspace=workspace, **manifest)  # type: ignore[arg-type]
    started = time.perf_counter()
    assert materialize_artifacts(client=None, workspace=workspace, **manifest) == 0  # type: ignore[arg-type]
    return (time.perf_counter() - started) * 1000


def measure_history_files(args: argparse.Namespace) -> list[Row]:
    with bench_database(args.postgres) as vendor:
        from django.contrib.auth import get_user_model
        from django.db import transaction
        from rest_framework.test import APIClient

        import backend.dispatch.payload as payload
        from backend.dispatch.policies import resolve_policy
        from backend.dispatch.prompts import build_turn_prompt
        from backend.dispatch.workers import ensure_worker_account
        from backend.tasks.factories import conversation, pending_assistant_turns
        from backend.tasks.models import Subtask
        from backend.tasks.transcripts import store_transcripts

        owner = get_user_model().objects.create(username="bench")
        worker, _ = ensure_worker_account(username="bench-worker")
        client = APIClient()
        client.force_authenticate(worker)
        rounds = args.history_turns // 2
        started = time.perf_counter()
        task = conversation(
            owner=owner,
            messages=[f"question {number}" for number in range(rounds + 1)],
            answers=(_answer(number) for number in range(rounds)),
        )
        seeded_in = time.perf_counter() - started

        def dispatch() -> tuple[float, dict[str, Any], int]:
            with transaction.atomic():
                started = time.perf_counter()
                response = client.post(
                    "/api/executor/dispatch/",
                    {"kinds": ["codex"], "limit": 1, "worker_id": "bench"},
                    format="json",
                )
                elapsed = time.perf_counter() - started
                assert response.status_code == 200, response.content[:200]
                transaction.set_rollback(True)
            [turn] = response.json()["turns"]
            return elapsed * 1000, turn, len(response.content)

        spilled = Subtask.objects.filter(artifact__isnull=False).count()
        first_ms, first, _ = dispatch()
        # The measured runs roll back: store the turn files for good, as that first dispatch
        # would have, so they find them stored.
        [pending] = pending_assistant_turns(task=task)
        prompt = build_turn_prompt(
            subtask=pending, task=task, resolved=resolve_policy(task_type=task.task_type)
        )
        assert prompt.transcript is not None
        store_transcripts({task.pk: prompt.transcript})

        original = payload.transcripts_for

        def without_turn_files(requests):  # type: ignore[no-untyped-def]
            return {
                task_id: dataclasses.replace(transcript, turn_files=())
                for task_id, transcript in original(requests).items()
            }

        timings: dict[str, list[float]] = {"with": [], "without": []}
        sizes: dict[str, tuple[int, int]] = {}
        for _ in range(args.history_runs):
            for name in ("without", "with"):
                payload.transcripts_for = without_turn_files if name == "without" else original  # type: ignore[assignment]
                elapsed, turn, size = dispatch()
                timings[name].append(elapsed)
                sizes[name] = (size, len(turn["artifacts"]))
        payload.transcripts_for = original  # type: ignore[assignment]
        _, turn, _ = dispatch()
        worker_ms = _worker_pass(turn)
    turns = f"{2 * rounds:,} earlier turns ({vendor})"
    size, files = sizes["with"]
    return [
        Row(
            f"dispatch with history files, {turns}",
            statistics.median(timings["with"]),
            "ms",
            baseline_name="without the newest turns' files",
            baseline_value=statistics.median(timings["without"]),
            note=f"response {size / 1024:,.0f} KiB, {files:,} manifest entries; "
            f"seeded in {seeded_in:.0f} s",
        ),
        Row(
            f"first dispatch, every turn file written, {turns}",
            first_ms,
            "ms",
            note=f"{len(first['artifacts']):,} files, {2 * rounds - spilled:,} of them written",
        ),
        Row(f"worker's pass, every file present, {turns}", worker_ms, "ms"),
    ]


# -- transcripts: what the transcript costs a dispatch that leaves turns out -----------------


def measure_transcripts(args: argparse.Namespace) -> list[Row]:
    rows = []
    with bench_database(args.postgres) as vendor:
        from django.contrib.auth import get_user_model
        from django.db import transaction

        from backend.dispatch.policies import resolve_policy
        from backend.dispatch.prompts import build_turn_prompt
        from backend.tasks.factories import conversation, pending_assistant_turns
        from backend.tasks.transcripts import store_transcripts

        owner = get_user_model().objects.create(username="bench")
        for rounds in (int(value) for value in args.transcript_rounds.split(",")):
            task = conversation(
                owner=owner,
                messages=[f"question {number}" for number in range(rounds + 1)],
                answers=(f"{number}: {ANSWER}" for number in range(rounds)),
            )
            [turn] = pending_assistant_turns(task=task)
            resolved = resolve_policy(task_type=task.task_type)
            without: list[float] = []
            with_transcript: list[float] = []
            size = 0
            for _ in range(args.transcript_runs):
                started = time.perf_counter()
                build_turn_prompt(subtask=turn, task=task, resolved=resolved, find_transcript=False)
                without.append(time.perf_counter() - started)
                started = time.perf_counter()
                with transaction.atomic():
                    prompt = build_turn_prompt(subtask=turn, task=task, resolved=resolved)
                    assert prompt.transcript is not None
                    store_transcripts({task.pk: prompt.transcript})
                with_transcript.append(time.perf_counter() - started)
                size = prompt.transcript.pointer.total_chars
            rows.append(
                Row(
                    f"next prompt with its transcript, {rounds:,} rounds ({vendor})",
                    statistics.median(with_transcript) * 1000,
                    "ms",
                    baseline_name="without",
                    baseline_value=statistics.median(without) * 1000,
                    note=f"transcript of {size:,} chars",
                )
            )
    return rows


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--claim-turns", type=int, default=20_000, help="claims: pending turns")
    parser.add_argument("--claim-workers", type=int, default=8, help="claims: worker processes")
    parser.add_argument("--limit", type=int, default=10, help="claims: turns a dispatch call")
    parser.add_argument("--dispatches", type=int, default=1_000, help="cpu: dispatches measured")
    parser.add_argument("--blocks", type=int, default=4, help="cpu: blocks (their minimum)")
    parser.add_argument("--cpu-report", action="store_true", help="cpu: report each turn")
    parser.add_argument(
        "--native-sessions",
        action="store_true",
        help="cpu: each report names a native session, as Codex's and Claude Code's do",
    )
    parser.add_argument(
        "--cpu-http", action="store_true", help="cpu: over HTTP to gunicorn, against the bare view"
    )
    parser.add_argument(
        "--show-statements",
        action="store_true",
        help="cpu, in process: print the start of each statement one dispatch sends",
    )
    parser.add_argument(
        "--show-plans",
        action="store_true",
        help="cpu, in process: how often PostgreSQL planned each prepared statement",
    )
    parser.add_argument(
        "--history-turns", type=int, default=2_000, help="history_files: earlier turns"
    )
    parser.add_argument(
        "--history-runs", type=int, default=5, help="history_files: dispatches each way"
    )
    parser.add_argument(
        "--transcript-rounds", default="20,200,1000", help="transcripts: conversation lengths"
    )
    parser.add_argument("--transcript-runs", type=int, default=15, help="transcripts: builds")


SCENARIO = Scenario(
    name=Path(__file__).stem,
    summary="Dispatch in process: claims, the CPU of a dispatch, history files, transcripts.",
    measurements=(
        Measurement("claims", measure_claims),
        Measurement("cpu", measure_cpu, postgres_only=True),
        Measurement("history_files", measure_history_files),
        Measurement("transcripts", measure_transcripts),
    ),
    add_arguments=add_arguments,
    quick={
        "claim_turns": 500,
        "claim_workers": 2,
        "dispatches": 100,
        "blocks": 2,
        "history_turns": 200,
        "history_runs": 2,
        "transcript_rounds": "20,100",
        "transcript_runs": 3,
    },
)

if __name__ == "__main__":
    SCENARIO.main()
