"""What the history files cost a dispatch of a long conversation: with and without them.

Run from the repository root:

    .venv/bin/python bench/bench_history_files.py                     # 10,000 turns, SQLite
    .venv/bin/python bench/bench_history_files.py --turns 2000 --runs 9
    .venv/bin/python bench/bench_history_files.py --postgres postgres://postgres@127.0.0.1:5432/postgres

Stores one task of `--turns` earlier turns through the real services (answers of ~600 chars,
one in a hundred ~22,000 chars, which spills) under the shipped policy, which keeps 20 messages,
and dispatches its next turn through the whole HTTP stack (`POST /api/executor/dispatch/`: claim,
prompt, transcript, history files, report row, serialization). Each dispatch runs in a
transaction that is rolled back, so every run claims the same turn.

1. The first dispatch after the feature meets the task: every turn without an artifact gets its
   turn file written (once in the task's life).
2. Then, interleaved, `--runs` dispatches each way: with the history files (every turn file
   already stored: listing them costs no write), and without the newest turns' files (the
   tail's turn files are taken out of the transcripts before they are stored; the sealed
   parts' lists of turn files stay).
3. The worker's side: `materialize_artifacts` over the manifest when every file is already in
   the workspace (what each later dispatch costs the worker: hashing the files it has, its
   cached parts and lists, and the files assembled from them).

Prints medians, the response size and the number of manifest entries.
"""

from __future__ import annotations

import argparse
import dataclasses
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

from _django import bench_database

ANSWER = (
    "I ran the suite: 212 passed, 3 failed in tests/test_upload.py. The failures share a tmp dir;"
    " the cleanup of one test removes files another still reads. "
) * 4
LONG_ANSWER = "".join(f"build step {n:05d}: compiled module ok\n" for n in range(600))


def answer(number: int) -> str:
    return f"{number}: {LONG_ANSWER}" if number % 100 == 99 else f"{number}: {ANSWER}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--postgres", help="server URL; a throwaway database is created there")
    parser.add_argument("--turns", type=int, default=10_000)
    parser.add_argument("--runs", type=int, default=5)
    args = parser.parse_args()
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
        rounds = args.turns // 2
        started = time.perf_counter()
        task = conversation(
            owner=owner,
            messages=[f"question {number}" for number in range(rounds + 1)],
            answers=(answer(number) for number in range(rounds)),
        )
        seconds = time.perf_counter() - started
        print(f"{vendor}: {2 * rounds:,} earlier turns stored in {seconds:.0f} s")

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
        print(
            f"first dispatch, every turn file new: {first_ms:,.0f} ms "
            f"({len(first['artifacts']):,} files, {2 * rounds - spilled:,} of them written)"
        )
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
        for _ in range(args.runs):
            for name in ("without", "with"):
                payload.transcripts_for = without_turn_files if name == "without" else original  # type: ignore[assignment]
                elapsed, turn, size = dispatch()
                timings[name].append(elapsed)
                sizes[name] = (size, len(turn["artifacts"]))
        payload.transcripts_for = original  # type: ignore[assignment]
        print(f"{'dispatch':>8} | {'median':>9} | {'min':>9} | {'response':>10} | files")
        for name in ("without", "with"):
            size, files = sizes[name]
            print(
                f"{name:>8} | {statistics.median(timings[name]):>6,.0f} ms | "
                f"{min(timings[name]):>6,.0f} ms | {size / 1024:>7,.0f} KiB | {files:,}"
            )

        _, turn, _ = dispatch()
        print(f"worker, every file present: {check_workspace(turn):,.0f} ms")


class _LocalBackend:
    """The worker's downloads served from this process's artifact store (no HTTP): what the
    worker's first pass over a fresh workspace fetches."""

    def download(self, *, url: str, destination: Path, sha256: str) -> None:
        from backend.artifacts.models import Artifact
        from backend.artifacts.selectors import artifact_content

        artifact = Artifact.objects.get(pk=url.rstrip("/").split("/")[-2])
        destination.write_bytes(b"".join(artifact_content(artifact=artifact)))


def check_workspace(turn: dict[str, Any]) -> float:
    """Lay the turn's manifest out in a fresh workspace (parts and lists included), then time
    the worker's next pass over it (every file present: hashed, nothing downloaded)."""
    from executors.client import ArtifactEntry, ArtifactPartRef
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


if __name__ == "__main__":
    main()
