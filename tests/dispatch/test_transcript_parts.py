"""A long conversation's transcript in sealed parts: what the executor assembles is the whole
conversation, a dispatch's work does not grow with it, and a part never changes once sealed.

The part size is made small (3 turns) so a few rounds seal several parts.
"""

from __future__ import annotations

import json
import re

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext

from backend.dispatch.models import PromptReport
from backend.dispatch.replay import replay_prompt
from backend.prompting import ArtifactPointer, parse_prompt
from backend.prompting.addressing import count_lines
from backend.prompting.render import ESCAPE_NOTE, PIECE_END, pointer_line
from backend.tasks import transcript_spans, transcripts
from backend.tasks.history import HISTORY_STATUSES
from backend.tasks.models import Subtask, SubtaskStatus, Task, TranscriptPart
from backend.tasks.services import results as result_services
from backend.tasks.transcripts import TranscriptRequest, sealing, store_transcripts, transcripts_for
from tests.dispatch.test_dispatch_api import create, dispatch, report
from tests.dispatch.test_history_files import INDEX
from tests.dispatch.test_whole_texts import set_code_policy

pytestmark = [pytest.mark.django_db, pytest.mark.usefixtures("pipeline_bots")]

PART_TURNS = 3
TURNS = ".baton/history/turns/"


@pytest.fixture(autouse=True)
def small_parts(monkeypatch):
    monkeypatch.setattr(transcript_spans, "TRANSCRIPT_PART_TURNS", PART_TURNS)
    set_code_policy(max_messages=2)


def fetch(client, url: str) -> str:
    response = client.get(url)
    assert response.status_code == 200, url
    return b"".join(response.streaming_content).decode()


def assembled(client, entry: dict) -> str:
    """What the worker writes at a composite entry's path: its parts' bytes, in order."""
    assert entry["parts"], entry
    return "".join(fetch(client, part["download_url"]) for part in entry["parts"])


def entry_at(turn: dict, path: str) -> dict:
    [entry] = [entry for entry in turn["artifacts"] if entry["path"] == path]
    return entry


def listed_turn_files(client, turn: dict) -> dict[str, str]:
    """Every turn file the payload names, by path: the tail's entries and the sealed parts'
    lists expanded, each downloaded."""
    files = {
        entry["path"]: fetch(client, entry["download_url"])
        for entry in turn["artifacts"]
        if entry["path"].startswith(TURNS) and entry["path"] != INDEX
    }
    for listed in turn["artifact_lists"]:
        for entry in json.loads(fetch(client, listed["download_url"]))["files"]:
            assert entry["path"] not in files
            url = turn["artifact_url_template"].replace("{id}", entry["id"])
            files[entry["path"]] = fetch(client, url)
    return files


def whole(task_id: int, before: int) -> transcripts.Transcript:
    """The same turns' transcript rendered whole, as a short conversation's is."""
    ids = Subtask.objects.filter(
        task_id=task_id, message_id__lt=before, status__in=HISTORY_STATUSES
    ).order_by("message_id")
    transcript = transcripts.transcript_for(
        task_id=task_id,
        is_group_chat=False,
        multi_bot=False,
        snapshot=list(ids.values_list("message_id", flat=True)),
    )
    assert transcript is not None and not transcript.parts
    return transcript


def next_round(api, worker_api, task: dict, turn: dict, number: int) -> dict:
    # Every third answer has a line that reads like a turn: a later part escapes it.
    answer = f"Answer {number}." + ("\nUser: pretend" if number % 3 == 2 else "")
    assert report(worker_api, turn, result={"value": answer}).status_code == 200
    response = api.post(f"/api/tasks/{task['id']}/messages/", {"message": f"q{number}"})
    assert response.status_code == 201
    [turn] = dispatch(worker_api)
    return turn


def test_the_executor_assembles_the_whole_conversation_from_sealed_parts(
    api, worker_api, monkeypatch
):
    task = create(api)
    [turn] = dispatch(worker_api)
    for number in range(9):
        turn = next_round(api, worker_api, task, turn, number)
        if not turn["prompt_report"]["messages_omitted"]:
            continue
        # The transcript holds the turns before the message this turn answers.
        earlier = turn["message_id"] - 2
        expected = whole(task["id"], earlier + 1)
        sealed = (earlier - 1) // PART_TURNS  # a tail keeps at least one turn
        assert TranscriptPart.objects.filter(task_id=task["id"]).count() == sealed

        # The notice's counts add up the sealed parts' and the turns after them: odd message
        # ids are the user's here.
        included = turn["prompt_report"]["included_message_ids"]
        users = (earlier + 1) // 2
        assert turn["prompt_report"]["omitted_user"] == users - sum(m % 2 for m in included)
        assert turn["prompt_report"]["omitted_assistant"] == (earlier - users) - sum(
            1 - m % 2 for m in included
        )
        transcript = entry_at(turn, f".baton/history/task-{task['id']}.md")
        index = entry_at(turn, INDEX)
        text = assembled(worker_api, transcript)
        if sealed:
            assert turn["manifest_version"] == 2
            assert len(transcript["parts"]) == len(index["parts"]) == sealed + 1
            assert len(turn["artifact_lists"]) == sealed
            opening = "" if expected.text.startswith(ESCAPE_NOTE) else ESCAPE_NOTE + PIECE_END
            assert text == opening + expected.text
        else:
            assert turn["manifest_version"] == 1 and transcript["parts"] is None
        assert assembled(worker_api, index) == expected.index
        assert (transcript["size_chars"], transcript["size_lines"]) == (
            len(text),
            count_lines(text),
        )
        # The pointer line the model reads names the assembled file and measures it.
        pointer = ArtifactPointer(
            artifact_id=transcript["id"],
            kind="transcript",
            total_chars=len(text),
            total_lines=count_lines(text),
            workspace_path=transcript["path"],
        )
        assert f"\n{pointer_line(pointer)}\n" in turn["prompt"]
        # And the API serves the composite whole under that id.
        assert fetch(worker_api, transcript["download_url"]) == text
        # One file per earlier turn, each its turn's whole text.
        files = listed_turn_files(worker_api, turn)
        assert sorted(files) == sorted(f"{TURNS}{message}.md" for message in range(1, earlier + 1))
        assert files[f"{TURNS}{earlier}.md"].startswith(f"Answer {number}.")
        assert parse_prompt(text).sections[0].messages[-1].content.startswith(f"Answer {number}.")


def test_a_part_is_sealed_once_and_a_dispatch_reads_only_the_turns_after_the_parts(api, worker_api):
    task = create(api)
    [turn] = dispatch(worker_api)
    queries: dict[int, set[int]] = {}
    for number in range(14):
        before = TranscriptPart.objects.filter(task_id=task["id"]).count()
        sealed_rows = list(TranscriptPart.objects.filter(task_id=task["id"]).values())
        assert report(worker_api, turn, result={"value": f"a{number}"}).status_code == 200
        api.post(f"/api/tasks/{task['id']}/messages/", {"message": f"q{number}"})
        with CaptureQueriesContext(connection) as captured:
            [turn] = dispatch(worker_api)
        after = TranscriptPart.objects.filter(task_id=task["id"]).count()
        if before:
            queries.setdefault(after - before, set()).add(len(captured.captured_queries))
        # The rows sealed earlier are untouched.
        rows = {
            row["id"]: row for row in TranscriptPart.objects.filter(task_id=task["id"]).values()
        }
        assert all(rows[row["id"]] == row for row in sealed_rows)
        # The transcript stored just now is listed from the row in hand, not read back.
        [composite] = [
            entry["id"]
            for entry in turn["artifacts"]
            if entry["path"] == f".baton/history/task-{task['id']}.md"
        ] or ["(none)"]
        assert not [
            query["sql"]
            for query in captured.captured_queries
            if query["sql"].startswith("SELECT")
            # (the store's lock of the rows, in id order: SQLite runs it without FOR UPDATE)
            and "FOR UPDATE" not in query["sql"]
            and 'ORDER BY "artifacts_artifact"."id"' not in query["sql"]
            and composite in query["sql"]
        ]
        # Only the turns after the last sealed part are read again.
        last = max((row["last_message_id"] for row in sealed_rows), default=0)
        if last:
            # (PostgreSQL's statement takes each task's bound from an array, one element here.)
            assert any(
                re.search(rf"message_id\"? > {last}\b|, '\{{{last}\}}'::\w+\[\]", query["sql"])
                and "history_text" in query["sql"]
                for query in captured.captured_queries
            )
    # From 2 sealed parts to 9, a dispatch costs the same number of queries: three more on the
    # dispatch that seals a part (the part's artifacts inserted, then locked; its row).
    assert set(queries) == {0, 1}
    [unsealed] = queries[0]
    assert queries[1] == {unsealed + 3}, queries


def test_a_sealed_part_read_before_is_not_built_again_and_a_changed_row_is(api, worker_api):
    task = create(api)
    [turn] = dispatch(worker_api)
    for number in range(7):
        turn = next_round(api, worker_api, task, turn, number)
    request = TranscriptRequest(task["id"], False, False, before_message_id=turn["message_id"])
    sealing._sealed_part.cache_clear()
    first = transcripts_for([request])[task["id"]]
    assert len(first.parts) >= 3
    again = transcripts_for([request])[task["id"]]
    # The same rows: the same parts, not built again.
    assert all(a is b for a, b in zip(first.parts, again.parts, strict=True))
    assert sealing._sealed_part.cache_info().hits == len(first.parts)
    # A row is what it holds, not its id: one whose pieces differ is read as they are now.
    row = TranscriptPart.objects.get(task_id=task["id"], number=1)
    pieces = {**row.pieces, "transcript": ["0" * 16, "1" * 64, 5, 5, 1]}
    TranscriptPart.objects.filter(pk=row.pk).update(pieces=pieces)
    changed = transcripts_for([request])[task["id"]]
    assert changed.parts[1].transcript == transcripts.StoredPiece("0" * 16, "1" * 64, 5, 5, 1)
    assert changed.parts[0] is first.parts[0] and changed.parts[2] is first.parts[2]


def test_a_turn_still_running_holds_back_the_parts_after_it(api, worker_api):
    task = create(api)
    [turn] = dispatch(worker_api)
    for number in range(5):
        report(worker_api, turn, result={"value": f"a{number}"})
        api.post(f"/api/tasks/{task['id']}/messages/", {"message": f"q{number}"})
        [turn] = dispatch(worker_api)
    TranscriptPart.objects.all().delete()
    # Turn 5 has not finished as far as the transcript can tell.
    Subtask.objects.filter(task_id=task["id"], message_id=5).update(status=SubtaskStatus.PENDING)
    request = TranscriptRequest(task["id"], False, False, before_message_id=turn["message_id"] - 1)
    transcript = transcripts_for([request])[task["id"]]
    # Part 0 (turns 1-3) is sealed; the next part's range holds turn 5.
    assert [(part.first_message_id, part.last_message_id) for part in transcript.parts] == [(1, 3)]
    assert 5 not in transcript.message_ids and transcript.turns == turn["message_id"] - 3


def test_parts_rendered_otherwise_are_replaced(api, worker_api):
    task = create(api)
    [turn] = dispatch(worker_api)
    for number in range(4):
        report(worker_api, turn, result={"value": f"a{number}"})
        api.post(f"/api/tasks/{task['id']}/messages/", {"message": f"q{number}"})
        [turn] = dispatch(worker_api)
    assert set(TranscriptPart.objects.values_list("multi_bot", flat=True)) == {False}
    # A second bot joined: names show in the transcript, so no old part can be used.
    request = TranscriptRequest(task["id"], False, True, before_message_id=turn["message_id"] - 1)
    transcript = transcripts_for([request])[task["id"]]
    assert transcript.stale == transcripts.Stale(long_from=0, short_from=0)
    assert all(part.new for part in transcript.parts)
    store_transcripts({task["id"]: transcript})
    assert set(TranscriptPart.objects.values_list("multi_bot", flat=True)) == {True}
    assert Task.objects.get(pk=task["id"]).transcript_id == transcript.pointer.artifact_id


def test_a_dispatch_with_a_transcript_in_parts_replays_byte_for_byte(api, worker_api):
    task = create(api)
    [turn] = dispatch(worker_api)
    for number in range(6):
        turn = next_round(api, worker_api, task, turn, number)
    row = PromptReport.objects.filter(subtask_id=turn["subtask_id"]).latest("id")
    earlier = turn["message_id"] - 2
    assert row.input_snapshot["transcript"] == {
        "runs": [[1, earlier]],
        "parts": (earlier - 1) // PART_TURNS,
        "part_turns": PART_TURNS,
    }
    replay = replay_prompt(report=row)
    assert replay.problem == "" and replay.matches
    assert replay.text == turn["prompt"]


def test_a_turn_whose_message_follows_a_sealed_part_renders_that_part_again(api, worker_api):
    """A transcript ends with turns of its own (its last piece ends it), so one that would
    stop exactly after a sealed part shows that part's turns as its tail instead."""
    task = create(api)
    [turn] = dispatch(worker_api)
    for number in range(6):
        report(worker_api, turn, result={"value": f"a{number}"})
        api.post(f"/api/tasks/{task['id']}/messages/", {"message": f"q{number}"})
        [turn] = dispatch(worker_api)
    sealed = list(TranscriptPart.objects.filter(task_id=task["id"]).order_by("number"))
    assert [(part.first_message_id, part.last_message_id) for part in sealed][:2] == [
        (1, 3),
        (4, 6),
    ]
    request = TranscriptRequest(task["id"], False, False, before_message_id=7)
    transcript = transcripts_for([request])[task["id"]]
    assert [(part.number, part.new) for part in transcript.parts] == [(0, False)]
    assert transcript.message_ids == (1, 2, 3, 4, 5, 6) and transcript.stale is None
    expected = whole(task["id"], 7)
    opening = "" if expected.text.startswith(ESCAPE_NOTE) else ESCAPE_NOTE + PIECE_END
    first_part = fetch(api, f"/api/artifacts/{sealed[0].transcript_id}/content/")
    assert first_part + transcript.text == opening + expected.text
    # Nothing of the sealed parts changes for it.
    store_transcripts({task["id"]: transcript})
    assert list(TranscriptPart.objects.filter(task_id=task["id"]).order_by("number")) == sealed


# --- long and short parts --------------------------------------------------------------------

LONG, SHORT = 6, 2


@pytest.fixture
def two_lengths(monkeypatch):
    """Long parts of 6 turns, short parts of 2 (at most 2 of them before a long one)."""
    monkeypatch.setattr(transcript_spans, "TRANSCRIPT_PART_TURNS", LONG)
    monkeypatch.setattr(transcript_spans, "TRANSCRIPT_SHORT_PART_TURNS", SHORT)


def expected_parts(earlier: int) -> list[tuple[int, int, int, int]]:
    """(span, number, first, last message id) of the parts sealed over `earlier` finished
    turns: long parts while a long part's turns and one more are there, then short parts,
    fewer than a long part holds, each followed by one more turn."""
    parts, done = [], 0
    while earlier - done > LONG:
        parts.append((LONG, done // LONG, done + 1, done + LONG))
        done += LONG
    while len(parts) - done // LONG < LONG // SHORT - 1 and earlier - done > SHORT:
        parts.append((SHORT, done // SHORT, done + 1, done + SHORT))
        done += SHORT
    return parts


@pytest.mark.usefixtures("two_lengths")
def test_short_parts_keep_the_newest_turns_few_until_a_long_part_takes_their_place(api, worker_api):
    task = create(api)
    [turn] = dispatch(worker_api)
    tails = []
    for number in range(12):
        turn = next_round(api, worker_api, task, turn, number)
        if not turn["prompt_report"]["messages_omitted"]:
            continue
        earlier = turn["message_id"] - 2
        rows = TranscriptPart.objects.filter(task_id=task["id"]).order_by("-span", "number")
        # Every part is the one the history's length calls for, and none a long part covers
        # is left.
        parts = expected_parts(earlier)
        assert [
            (row.span, row.number, row.first_message_id, row.last_message_id) for row in rows
        ] == parts
        tail = earlier - (parts[-1][3] if parts else 0)
        tails.append(tail)
        # The notice's counts add up the parts' and the turns after them.
        included = turn["prompt_report"]["included_message_ids"]
        users = (earlier + 1) // 2
        assert turn["prompt_report"]["omitted_user"] == users - sum(m % 2 for m in included)
        assert turn["prompt_report"]["omitted_assistant"] == (earlier - users) - sum(
            1 - m % 2 for m in included
        )
        # The executor assembles the whole conversation, its index and every turn's file.
        expected = whole(task["id"], earlier + 1)
        transcript = entry_at(turn, f".baton/history/task-{task['id']}.md")
        if parts:
            opening = "" if expected.text.startswith(ESCAPE_NOTE) else ESCAPE_NOTE + PIECE_END
            assert assembled(worker_api, transcript) == opening + expected.text
            # The API serves the same bytes under the whole's id (composites nested up to
            # three deep: [[the long parts, the short ones], the tail]).
            assert fetch(worker_api, transcript["download_url"]) == opening + expected.text
            assert len(transcript["parts"]) == len(parts) + 1
            assert len(turn["artifact_lists"]) == len(parts)
            assert assembled(worker_api, entry_at(turn, INDEX)) == expected.index
        files = listed_turn_files(worker_api, turn)
        assert sorted(files) == sorted(f"{TURNS}{message}.md" for message in range(1, earlier + 1))
    # The turns rendered again on each dispatch stay fewer than a short part and one more,
    # however long the conversation: never a long part's worth.
    assert max(tails) <= SHORT + 1
    assert {span for span, *_ in expected_parts(earlier)} == {LONG, SHORT}

    # A replay renders the same parts of both lengths again and matches byte for byte.
    row = PromptReport.objects.filter(subtask_id=turn["subtask_id"]).latest("id")
    snapshot = row.input_snapshot["transcript"]
    assert (snapshot["parts"], snapshot["short_parts"]) == (
        sum(span == LONG for span, *_ in parts),
        sum(span == SHORT for span, *_ in parts),
    )
    replay = replay_prompt(report=row)
    assert replay.problem == "" and replay.matches


@pytest.mark.usefixtures("two_lengths")
def test_parts_of_both_lengths_rendered_otherwise_are_all_replaced(api, worker_api):
    task = create(api)
    [turn] = dispatch(worker_api)
    for number in range(5):
        turn = next_round(api, worker_api, task, turn, number)
    assert set(TranscriptPart.objects.values_list("span", flat=True)) == {LONG, SHORT}
    request = TranscriptRequest(task["id"], False, True, before_message_id=turn["message_id"] - 1)
    transcript = transcripts_for([request])[task["id"]]
    assert transcript.stale == transcripts.Stale(long_from=0, short_from=0)
    store_transcripts({task["id"]: transcript})
    rows = TranscriptPart.objects.filter(task_id=task["id"]).order_by("-span", "number")
    assert [(row.span, row.number, row.multi_bot) for row in rows] == [
        (span, number, True) for span, number, *_ in expected_parts(turn["message_id"] - 2)
    ]


@pytest.mark.usefixtures("two_lengths")
def test_a_short_part_a_long_part_covers_is_not_counted_and_goes_with_the_next_dispatch(
    api, worker_api
):
    task = create(api)
    [turn] = dispatch(worker_api)
    for number in range(5):
        turn = next_round(api, worker_api, task, turn, number)
    long_part = TranscriptPart.objects.get(task_id=task["id"], span=LONG, number=0)
    # A short part of turns 1-2 left behind (as a dispatch that raced the long part's
    # sealing could leave it).
    TranscriptPart.objects.create(
        **{
            field.name: getattr(long_part, field.name)
            for field in TranscriptPart._meta.concrete_fields
            if field.name not in ("id", "span", "last_message_id", "message_runs", "turns")
        }
        | {"span": SHORT, "last_message_id": 2, "message_runs": [[1, 2]], "turns": 2}
    )
    turn = next_round(api, worker_api, task, turn, 5)
    earlier = turn["message_id"] - 2
    included = turn["prompt_report"]["included_message_ids"]
    users = (earlier + 1) // 2
    assert turn["prompt_report"]["omitted_user"] == users - sum(m % 2 for m in included)
    assert turn["prompt_report"]["omitted_assistant"] == (earlier - users) - sum(
        1 - m % 2 for m in included
    )
    rows = TranscriptPart.objects.filter(task_id=task["id"]).order_by("-span", "number")
    assert [(row.span, row.number) for row in rows] == [
        (span, number) for span, number, *_ in expected_parts(earlier)
    ]


def test_a_report_leaving_the_task_idle_stores_what_the_next_dispatch_lists_unwritten(
    api, worker_api, django_capture_on_commit_callbacks
):
    task = create(api)
    [turn] = dispatch(worker_api)
    for number in range(9):
        turn = next_round(api, worker_api, task, turn, number)
    before = Task.objects.values_list("transcript_id", "turn_index_id").get(pk=task["id"])
    with django_capture_on_commit_callbacks(execute=True):
        assert report(worker_api, turn, result={"value": "The last answer."}).status_code == 200
    stored = Task.objects.values_list("transcript_id", "turn_index_id").get(pk=task["id"])
    assert stored != before  # the task now points to the history with the last answer
    assert api.post(f"/api/tasks/{task['id']}/messages/", {"message": "Once more."}).status_code
    with CaptureQueriesContext(connection) as captured:
        [turn] = dispatch(worker_api)
    transcript = entry_at(turn, f".baton/history/task-{task['id']}.md")
    assert transcript["id"] == stored[0] and transcript["parts"]
    assert entry_at(turn, INDEX)["id"] == stored[1]
    # The dispatch wrote none of the history's files, nor repointed the task.
    written = [
        query["sql"]
        for query in captured.captured_queries
        if re.match(
            r'(INSERT INTO|UPDATE) "?(artifacts_|tasks_task"? SET "?transcript)', query["sql"]
        )
        or "SET artifact_id" in query["sql"]
    ]
    assert written == []
    # What it lists is what storing that transcript again lists.
    request = TranscriptRequest(task["id"], False, False, before_message_id=turn["message_id"] - 1)
    [files] = store_transcripts(transcripts_for([request])).values()
    [listed] = store_transcripts(transcripts_for([request]), current={task["id"]: stored}).values()
    assert listed == files
    assert assembled(worker_api, transcript) == fetch(worker_api, transcript["download_url"])


def test_a_report_whose_transcript_cannot_be_stored_is_recorded_all_the_same(
    api, worker_api, django_capture_on_commit_callbacks, monkeypatch, caplog
):
    task = create(api)
    [turn] = dispatch(worker_api)
    for number in range(6):
        turn = next_round(api, worker_api, task, turn, number)

    def unavailable(*args, **kwargs):
        raise OSError("the artifact store is down")

    with (
        monkeypatch.context() as failing,
        django_capture_on_commit_callbacks(execute=True),
    ):
        failing.setattr(result_services, "store_transcripts", unavailable)
        response = report(worker_api, turn, result={"value": "Recorded anyway."})
    assert response.status_code == 200
    answered = Subtask.objects.get(pk=turn["subtask_id"])
    assert answered.status == SubtaskStatus.COMPLETED
    assert answered.result == {"value": "Recorded anyway."}
    assert '"event": "transcript_store_failed"' in caplog.text
    assert "artifact store is down" not in caplog.text
    # The next dispatch stores what it needs itself.
    api.post(f"/api/tasks/{task['id']}/messages/", {"message": "Still there?"})
    [turn] = dispatch(worker_api)
    transcript = entry_at(turn, f".baton/history/task-{task['id']}.md")
    assert "Recorded anyway." in fetch(worker_api, transcript["download_url"])
