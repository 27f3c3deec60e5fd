"""End to end through the API: every cut a dispatched prompt shows leads back to the whole text.

Three shapes a product sends every day — a 1 MiB message, a two-step pipeline whose first step
answers with 70,000 characters, a 60-turn conversation — are dispatched, and each prompt is
checked as the executor would use it: every cut section ends with a pointer line, the pointer's
file is in the manifest at that path, and reading it back gives exactly the original text (for
the transcript, every earlier turn; for the history files the notice names, each earlier turn's
whole text in a file of its own, listed in the index).
"""

from __future__ import annotations

import json
import re

import pytest

from backend.prompting import Section, parse_prompt
from backend.prompting.turn_files import TURN_INDEX_PATH
from tests.dispatch.test_dispatch_api import PIPELINE, SINGLE, create, dispatch, report

pytestmark = [pytest.mark.django_db, pytest.mark.usefixtures("pipeline_bots")]

MARKER = re.compile(r"…\d+ chars truncated…")
TURN_FILE = re.compile(r"\.baton/history/turns/\d+\.md")


def read(client, url: str) -> str:
    response = client.get(url)
    assert response.status_code == 200
    return b"".join(response.streaming_content).decode()


def check_every_cut_leads_back(worker_api, turn: dict, originals: set[str]) -> int:
    """Check the prompt's pointers against its manifest and the originals; the number of cuts."""
    manifest = {(entry["id"], entry["path"]): entry for entry in turn["artifacts"]}
    document = parse_prompt(turn["prompt"])
    cuts = 0
    for section in document.sections:
        if section.notice is not None and section.notice.transcript is not None:
            pointer = section.notice.transcript
            entry = manifest[(pointer.artifact_id, pointer.workspace_path)]
            transcript = parse_prompt(read(worker_api, entry["download_url"]))
            shown = {message.content for message in transcript.sections[0].messages}
            assert len(transcript.sections[0].messages) >= section.notice.omitted
            assert shown <= originals | {c for c in shown if MARKER.search(c)}
            files = turn_files(worker_api, turn)
            check_history_files(
                worker_api, manifest, files, turns=len(transcript.sections[0].messages)
            )
            assert all(read(worker_api, entry["download_url"]) in originals for entry in files)
        for message in section.messages:
            if not MARKER.search(message.content):
                continue
            cuts += 1
            pointer = message.artifact
            assert pointer is not None, f"a cut in {section.section.value} has no pointer"
            entry = manifest[(pointer.artifact_id, pointer.workspace_path)]
            assert entry["size_chars"] == pointer.total_chars
            assert read(worker_api, entry["download_url"]) in originals
    return cuts


def turn_files(worker_api, turn: dict) -> list[dict]:
    """Every turn file the payload names, in order: the sealed parts' lists' entries (a long
    conversation's), then the manifest's own."""
    listed = []
    for artifact_list in turn["artifact_lists"]:
        for entry in json.loads(read(worker_api, artifact_list["download_url"]))["files"]:
            url = turn["artifact_url_template"].replace("{id}", entry["id"])
            listed.append({**entry, "download_url": url})
    return listed + [entry for entry in turn["artifacts"] if TURN_FILE.fullmatch(entry["path"])]


def check_history_files(worker_api, manifest: dict, files: list[dict], *, turns: int) -> None:
    """The index lists one file per earlier turn, each named by the payload at its path."""
    [index] = [entry for (_, path), entry in manifest.items() if path == TURN_INDEX_PATH]
    _, *rows = read(worker_api, index["download_url"]).splitlines()
    paths = [row.split("\t")[6] for row in rows]
    assert len(rows) == turns and paths == [entry["path"] for entry in files]


def test_a_one_mib_message(api, worker_api):
    message = "".join(f"line {number:07d} of a pasted log\n" for number in range(36_000))
    message = message[: 1024 * 1024]
    create(api, {**SINGLE, "message": message})
    [turn] = dispatch(worker_api)
    assert check_every_cut_leads_back(worker_api, turn, {message}) == 1
    assert parse_prompt(turn["prompt"]).sections[0].section is Section.CURRENT


def test_a_pipeline_whose_coder_answers_with_70000_chars(api, worker_api):
    create(api, PIPELINE)
    [coder] = dispatch(worker_api)
    code = (f"def function_{number}():\n    return {number}\n\n" for number in range(2_300))
    answer = "".join(code)[:70_000]
    report(worker_api, coder, result={"value": answer})
    [reviewer] = dispatch(worker_api, kinds=("claude_code",))
    assert check_every_cut_leads_back(worker_api, reviewer, {answer, PIPELINE["message"]}) == 1
    assert reviewer["prompt_report"]["previous_result_truncated"] is True


def test_a_60_turn_conversation(api, worker_api):
    task = create(api)
    originals = {SINGLE["message"]}
    for number in range(30):
        [turn] = dispatch(worker_api)
        if number:
            check_every_cut_leads_back(worker_api, turn, originals)
        # Some answers are long (cut by the per-message cap, some spilled), most are short.
        size = (9_750, 40_000, 120)[number % 3]
        answer = (f"answer {number}: " + "result line\n" * (size // 12))[:size]
        report(worker_api, turn, result={"value": answer})
        question = f"question {number + 1}"
        api.post(f"/api/tasks/{task['id']}/messages/", {"message": question}, format="json")
        originals |= {answer, question}
    [turn] = dispatch(worker_api)
    assert turn["prompt_report"]["messages_omitted"] > 0
    cuts = check_every_cut_leads_back(worker_api, turn, originals)
    assert cuts == len(turn["prompt_report"]["truncated"]) > 0
    assert any(entry["kind"] == "transcript" for entry in turn["artifacts"])


def test_a_spilled_json_answer_reaches_the_next_step_as_valid_json(api, worker_api):
    """The reviewer sees the coder's 60,000-char JSON answer as a JSON skeleton it can parse
    (first items, every top-level key, markers as JSON strings), and the pointer to the whole."""
    create(api, PIPELINE)
    [coder] = dispatch(worker_api)
    items = [{"file": f"src/module_{n}.py", "status": "changed", "lines": n} for n in range(900)]
    answer = {"summary": "Added retries to every client.", "files": items, "ok": True}
    report(worker_api, coder, result={"value": answer})
    [reviewer] = dispatch(worker_api, kinds=("claude_code",))
    whole = read(worker_api, reviewer["artifacts"][0]["download_url"])
    assert json.loads(whole) == answer
    assert check_every_cut_leads_back(worker_api, reviewer, {whole, PIPELINE["message"]}) == 1
    previous = parse_prompt(reviewer["prompt"]).section(Section.PREVIOUS_RESULT)
    assert previous is not None
    skeleton = json.loads(previous.messages[0].content)
    assert skeleton["summary"] == answer["summary"] and skeleton["ok"] is True
    assert skeleton["files"][0] == items[0]
    assert MARKER.fullmatch(skeleton["files"][-1])
