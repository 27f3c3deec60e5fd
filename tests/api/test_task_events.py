"""A task's live events: the log every change writes, and the Server-Sent Events stream that
resumes with Last-Event-ID — no gap, no duplicate — over real HTTP."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable, Iterator
from datetime import timedelta

import httpx
import pytest
from django.contrib.auth import get_user_model
from django.db import connection as django_connection
from django.utils import timezone
from rest_framework.authtoken.models import Token

from backend.api import event_feeds
from backend.api.event_feeds import FEEDS, sse_frame
from backend.dispatch.waiting import LISTENER
from backend.tasks import task_events
from backend.tasks.models import Task, TaskEvent
from backend.tasks.wakeups import EVENT_BELL
from tests.conftest import pooled_connections_idle
from tests.dispatch.test_dispatch_api import PIPELINE, create, dispatch, report

pytestmark = [pytest.mark.django_db, pytest.mark.usefixtures("pipeline_bots")]


@pytest.fixture(autouse=True)
def listener_stopped_after_each_test() -> Iterator[None]:
    """A stream on PostgreSQL starts the process's listener and its feed reader, whose own
    connections would keep PostgreSQL from dropping the test database."""
    yield
    FEEDS.stop()
    LISTENER.stop()


def logged(task) -> list[tuple[int, str, int | None]]:
    return list(
        TaskEvent.objects.filter(task_id=task["id"])
        .order_by("seq")
        .values_list("seq", "type", "subtask_id")
    )


def progress(worker_api, turn, **body):
    response = worker_api.post(
        f"/api/executor/subtasks/{turn['subtask_id']}/progress/",
        {"worker_id": "w1", "attempt": turn["attempt"], "events": [], **body},
        format="json",
    )
    assert response.status_code == 200, response.json()


def parse_frames(text: str) -> list[dict]:
    """The events of an SSE body: each frame's id, event and JSON data."""
    frames = []
    for block in text.split("\n\n"):
        fields = {}
        for line in block.split("\n"):
            if line and not line.startswith(":"):
                name, _, value = line.partition(": ")
                fields[name] = value
        if "id" in fields:
            frames.append(
                {"id": int(fields["id"]), "event": fields["event"], **json.loads(fields["data"])}
            )
    return frames


def read_stream(product: httpx.Client, task, **headers) -> list[dict]:
    """A whole stream over HTTP (it ends after BATON_EVENT_STREAM_SECONDS)."""
    response = product.get(f"/api/tasks/{task['id']}/events/", headers=headers)
    assert response.status_code == 200, response.text
    assert response.headers["content-type"].startswith("text/event-stream")
    assert response.text.startswith("retry: ")
    return parse_frames(response.text)


def follow(
    client: httpx.Client,
    url: str,
    got: list[dict],
    *,
    stop_after: int,
    headers: dict[str, str] | None = None,
    seen: Callable[[int], object] = lambda count: None,
) -> None:
    """Follow a stream live, adding each frame to `got` and calling `seen` with their count,
    until `stop_after` frames are in; then the client drops the connection."""
    with client.stream("GET", url, headers=headers or {}) as stream:
        assert stream.status_code == 200
        buffer = ""
        for chunk in stream.iter_text():
            buffer += chunk
            while "\n\n" in buffer:
                block, buffer = buffer.split("\n\n", 1)
                got.extend(parse_frames(block + "\n\n"))
                seen(len(got))
                if len(got) >= stop_after:
                    return


@pytest.fixture
def product(live_server, user):
    """The `api` fixture's account, over real HTTP to the live server."""
    token = Token.objects.get_or_create(user=user)[0].key
    headers = {"Authorization": f"Token {token}"}
    with httpx.Client(base_url=live_server.url, headers=headers, timeout=30) as client:
        yield client


@pytest.mark.usefixtures("no_progress_grace")
def test_every_change_to_a_turn_is_logged_in_order(api, worker_api):
    task = create(api, PIPELINE)
    coder_id, reviewer_id = task["turns"][1]["id"], task["turns"][2]["id"]
    [coder] = dispatch(worker_api, kinds=["codex", "claude_code"])
    progress(worker_api, coder, partial_text="Reading", events=[{"type": "message"}])
    progress(worker_api, coder, partial_text="Reading retry.py")
    first, second = TaskEvent.objects.filter(task_id=task["id"], type="turn.progress").order_by(
        "seq"
    )
    assert (first.seq, second.seq) == (5, 6)
    first, second = first.data, second.data
    # Progress says what the answer gained, not the whole answer again.
    assert (first["text"], second["text"]) == ("Reading", " retry.py")
    assert second["partial_text_chars"] == len("Reading retry.py")
    assert first["events"] == [{"type": "message"}]
    report(worker_api, coder, status="FAILED", error="boom")
    api.post(f"/api/tasks/{task['id']}/messages/", {"message": "again"}, format="json")
    new_round = [turn["id"] for turn in api.get(f"/api/tasks/{task['id']}/").json()["turns"][3:]]
    # The turn ended: its progress events are gone, their numbers unused; the rest stay.
    assert logged(task) == [
        (1, "turn.created", task["turns"][0]["id"]),
        (2, "turn.created", coder_id),
        (3, "turn.created", reviewer_id),
        (4, "turn.claimed", coder_id),
        (7, "turn.failed", coder_id),
        (8, "turn.failed", reviewer_id),  # the later step fails with it
        *[(9 + offset, "turn.created", turn_id) for offset, turn_id in enumerate(new_round)],
    ]
    assert len(new_round) == 3


def test_queue_interrupt_and_cancel_are_logged(api, worker_api):
    task = create(api)
    [turn] = dispatch(worker_api)
    queued = api.post(f"/api/tasks/{task['id']}/messages/", {"message": "later"}, format="json")
    api.post(f"/api/tasks/{task['id']}/queued-messages/{queued.json()['id']}/cancel/")
    api.post(
        f"/api/tasks/{task['id']}/messages/",
        {"message": "now", "strategy": "interrupt"},
        format="json",
    )
    api.post(f"/api/tasks/{task['id']}/cancel/")
    types = [event[1] for event in logged(task)]
    assert types == [
        "turn.created",
        "turn.created",
        "turn.claimed",
        "message.queued",
        "message.withdrawn",
        "turn.interrupted",
        "turn.created",
        "turn.created",
        "turn.cancelled",
    ]
    assert [seq for seq, _, _ in logged(task)] == list(range(1, 10))
    del turn


def test_progress_read_a_moment_after_the_end_is_still_there_and_goes_after_the_grace(
    api, worker_api
):
    """A live stream reads an event a moment after it is written; the attempt may end in
    that moment. Its progress events outlive it by the grace, then a later end sweeps them."""
    task = create(api)
    [turn] = dispatch(worker_api)
    progress(worker_api, turn, partial_text="last words")
    report(worker_api, turn, result={"value": "last words."})
    # What a stream that had read up to the claim (3) reads next: the progress is still there.
    after_claim = [(seq, kind) for seq, kind, _ in logged(task) if seq > 3]
    assert after_claim == [(4, "turn.progress"), (5, "turn.completed")]
    # Older than the grace, it goes with the task's next attempt that ends.
    TaskEvent.objects.filter(task_id=task["id"], type="turn.progress").update(
        created_at=timezone.now() - timedelta(seconds=task_events.PROGRESS_GRACE_SECONDS + 1)
    )
    api.post(f"/api/tasks/{task['id']}/messages/", {"message": "more"}, format="json")
    [again] = dispatch(worker_api)
    progress(worker_api, again, partial_text="more words")
    report(worker_api, again, result={"value": "more words."})
    assert [(seq, kind) for seq, kind, _ in logged(task) if kind == "turn.progress"] == [
        (9, "turn.progress")  # the new turn's, inside its grace
    ]


def test_long_progress_text_goes_by_reference(api, worker_api):
    task = create(api)
    [turn] = dispatch(worker_api)
    text = "x" * (task_events.PROGRESS_TEXT_CHARS + 500)
    progress(worker_api, turn, partial_text=text, events=[{"type": "message", "text": "y" * 5000}])
    event = TaskEvent.objects.get(task_id=task["id"], type="turn.progress")
    assert len(event.data["text"]) == task_events.PROGRESS_TEXT_CHARS
    assert event.data["text_omitted_chars"] == 500
    assert len(event.data["events"][0]["text"]) == task_events.EVENT_TEXT_CHARS
    assert len(json.dumps(event.data)) < 10_000
    # Its frame names where the whole partial text is: the turn's page of the task's turns.
    frame = parse_frames(sse_frame(event))[0]
    assert frame["partial_text_url"] == (
        f"/api/tasks/{task['id']}/subtasks/?after={turn['message_id'] - 1}&page_size=1"
    )
    page = api.get(frame["partial_text_url"]).json()
    assert [row["partial_text"] for row in page["results"]] == [text]


@pytest.mark.django_db(transaction=True)
@pytest.mark.usefixtures("shipped_bots", "no_progress_grace")
def test_a_stream_resumes_after_its_last_event_id_with_no_gap_and_no_duplicate(
    api, worker_api, product, settings
):
    settings.BATON_EVENT_STREAM_SECONDS = 0.2  # each read ends soon after catching up
    task = create(api)
    [turn] = dispatch(worker_api)
    progress(worker_api, turn, partial_text="half")
    seen = read_stream(product, task)
    assert [frame["event"] for frame in seen] == [
        "turn.created",
        "turn.created",
        "turn.claimed",
        "turn.progress",
    ]
    assert seen[3]["text"] == "half" and seen[3]["task_id"] == task["id"]
    # The client dropped after the claim; meanwhile the turn went on.
    progress(worker_api, turn, partial_text="half done")
    resumed = read_stream(product, task, **{"Last-Event-ID": str(seen[2]["id"])})
    assert [frame["id"] for frame in resumed] == [4, 5]
    assert [frame["event"] for frame in resumed] == ["turn.progress", "turn.progress"]
    assert resumed[1]["text"] == " done"
    report(worker_api, turn, result={"value": "done"})
    # The turn ended: its progress events are gone. A client that resumes after one of them,
    # or before them, gets the events after it: the gap in the numbers is no lost event.
    for last_event_id in (5, 4, 3):
        resumed = read_stream(product, task, **{"Last-Event-ID": str(last_event_id)})
        assert [(frame["id"], frame["event"]) for frame in resumed] == [(6, "turn.completed")]
    after = product.get(f"/api/tasks/{task['id']}/events/", params={"after": 6})
    assert parse_frames(after.text) == []


@pytest.mark.parametrize("last_event_id", ["abc", "-1", "1.5", "9" * 30])
def test_a_bad_last_event_id_is_a_400_naming_it(api, last_event_id):
    task = create(api)
    response = api.get(f"/api/tasks/{task['id']}/events/", HTTP_LAST_EVENT_ID=last_event_id)
    assert response.status_code == 400
    assert "Last-Event-ID" in response.json()["fields"]


def test_another_users_task_has_no_stream(api, other_api):
    task = create(api)
    assert other_api.get(f"/api/tasks/{task['id']}/events/").status_code == 404


@pytest.mark.django_db(transaction=True)
@pytest.mark.usefixtures("shipped_bots")
def test_a_process_serves_a_bounded_number_of_streams(api, product, settings):
    settings.BATON_MAX_EVENT_STREAMS = 1
    settings.BATON_EVENT_STREAM_SECONDS = 30
    task = create(api)
    url = f"/api/tasks/{task['id']}/events/"
    with product.stream("GET", url) as first:
        assert first.status_code == 200
        chunks = first.iter_text()  # kept: dropping it would close the stream
        assert next(chunks).startswith("retry: ")  # the stream is open
        busy = product.get(url)
        assert busy.status_code == 503
        assert busy.json()["code"] == "busy" and busy.headers["Retry-After"] == "5"
    # Once the first listener has gone, its slot is free again.
    deadline = time.monotonic() + 10
    while True:
        with product.stream("GET", url) as again:
            if again.status_code == 200:
                break
        assert time.monotonic() < deadline
        time.sleep(0.1)


@pytest.mark.django_db(transaction=True)
@pytest.mark.usefixtures("shipped_bots", "no_progress_grace")
def test_a_listener_over_http_sees_a_turn_live_and_resumes_after_dropping(
    live_server, worker_api, settings
):
    settings.BATON_EVENT_STREAM_SECONDS = 30
    owner = get_user_model().objects.create_user(username="listener")
    token = Token.objects.create(user=owner).key
    headers = {"Authorization": f"Token {token}"}
    with httpx.Client(base_url=live_server.url, headers=headers, timeout=30) as product:
        created = product.post(
            "/api/tasks/",
            json={"title": "Live", "task_type": "code", "message": "Go.", "executor": "codex"},
        )
        task = created.json()
        got: list[dict] = []
        two_seen = threading.Event()

        def listen(last_event_id: int | None, stop_after: int) -> None:
            extra = {} if last_event_id is None else {"Last-Event-ID": str(last_event_id)}
            follow(
                product,
                f"/api/tasks/{task['id']}/events/",
                got,
                stop_after=stop_after,
                headers=extra,
                seen=lambda count: count >= 2 and two_seen.set(),
            )

        listener = threading.Thread(target=listen, args=(None, 3))
        listener.start()
        assert two_seen.wait(10)  # the two turn.created arrive while the stream is open
        [turn] = dispatch(worker_api)  # turn.claimed reaches the open stream live
        listener.join(10)
        assert not listener.is_alive()
        progress(worker_api, turn, partial_text="working")
        report(worker_api, turn, result={"value": "done"})
        resumed = threading.Thread(target=listen, args=(got[-1]["id"], 4))
        resumed.start()
        resumed.join(10)
        assert not resumed.is_alive()
    # The progress event (4) was deleted when the turn ended, before the client came back.
    assert [frame["id"] for frame in got] == [1, 2, 3, 5]
    assert [frame["event"] for frame in got] == [
        "turn.created",
        "turn.created",
        "turn.claimed",
        "turn.completed",
    ]


def test_a_feed_hands_out_the_frames_after_a_cursor_and_says_when_it_no_longer_holds_them(
    monkeypatch,
):
    monkeypatch.setattr(event_feeds, "BUFFER_EVENTS", 3)
    feed = event_feeds.Feed(7, 2, on_ring=lambda feed: None)
    assert feed.frames_after(2) == []
    assert feed.frames_after(1) is None  # before the feed started: storage has it
    feed.extend([(3, "c"), (4, "d"), (3, "c again")])  # an event read twice is kept once
    assert feed.frames_after(2) == [(3, "c"), (4, "d")]
    assert feed.frames_after(3) == [(4, "d")]
    assert feed.frames_after(9) == []
    feed.extend([(5, "e"), (6, "f")])  # holds 3 frames: 3 is let go
    assert (feed.base, feed.head) == (3, 6)
    assert feed.frames_after(2) is None
    assert feed.frames_after(3) == [(4, "d"), (5, "e"), (6, "f")]


@pytest.mark.postgres_only
@pytest.mark.django_db(transaction=True)
@pytest.mark.usefixtures("shipped_bots")
def test_streams_of_a_task_share_one_reader_and_hold_no_database_connection(
    api, worker_api, product, settings
):
    settings.BATON_MAX_EVENT_STREAMS = 10
    settings.BATON_EVENT_STREAM_SECONDS = 30
    task = create(api)
    url = f"/api/tasks/{task['id']}/events/"

    def connections() -> int:
        """Sessions on the test database that are not waiting idle in the process's pool."""
        with django_connection.cursor() as cursor:
            cursor.execute(
                "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database()"
            )
            return cursor.fetchone()[0] - pooled_connections_idle()

    before = connections()
    listeners = 6
    got: list[list[dict]] = [[] for _ in range(listeners)]
    caught_up = [threading.Event() for _ in range(listeners)]
    done = [threading.Event() for _ in range(listeners)]

    def listen(index: int) -> None:
        follow(
            product,
            url,
            got[index],
            stop_after=4,
            seen=lambda count: count >= 2 and caught_up[index].set(),
        )
        done[index].set()

    threads = [threading.Thread(target=listen, args=(index,)) for index in range(listeners)]
    for thread in threads:
        thread.start()
    assert all(event.wait(10) for event in caught_up)
    deadline = time.monotonic() + 10
    # Caught up, each stream let go of its connection: what is left is the process's
    # listener and feed reader (and this test's own), however many streams are open.
    while connections() > before + 2:
        assert time.monotonic() < deadline, connections()
        time.sleep(0.05)
    reads = FEEDS.reads
    [turn] = dispatch(worker_api)
    progress(worker_api, turn, partial_text="working")
    assert all(event.wait(10) for event in done)
    for thread in threads:
        thread.join(10)
    for frames in got:
        assert [frame["id"] for frame in frames] == [1, 2, 3, 4]
        assert [frame["event"] for frame in frames][2:] == ["turn.claimed", "turn.progress"]
    # Two events, six streams: the reader read once per wake-up, not once per stream.
    assert 1 <= FEEDS.reads - reads <= 3


@pytest.mark.django_db(transaction=True)
@pytest.mark.usefixtures("shipped_bots")
@pytest.mark.filterwarnings("ignore::pytest.PytestUnhandledThreadExceptionWarning")
def test_streams_read_storage_themselves_when_their_feed_reader_has_died(
    api, worker_api, product, settings, monkeypatch
):
    settings.BATON_EVENT_STREAM_SECONDS = 30
    FEEDS.stop()

    def broken(feed):
        raise RuntimeError("a bug in the reader")

    monkeypatch.setattr(FEEDS, "_read", broken)
    task = create(api)
    got: list[dict] = []
    three = threading.Event()

    def listen() -> None:
        follow(product, f"/api/tasks/{task['id']}/events/", got, stop_after=3)
        three.set()

    listener = threading.Thread(target=listen)
    listener.start()
    deadline = time.monotonic() + 10
    while len(got) < 2 or FEEDS.reading:  # caught up, subscribed, and the reader is gone
        assert time.monotonic() < deadline
        time.sleep(0.05)
    dispatch(worker_api)
    assert three.wait(10)
    listener.join(10)
    assert [frame["event"] for frame in got] == ["turn.created", "turn.created", "turn.claimed"]


@pytest.mark.django_db(transaction=True)
def test_without_notifications_a_feed_learns_of_another_process_events_while_rings_come(
    api, shipped_bots
):
    """SQLite: another process's events are found by the reader's look every POLL_SECONDS,
    which rings for this process's own writes (of any task) never put off."""
    if django_connection.vendor == "postgresql":
        pytest.skip("PostgreSQL feeds hear each task's NOTIFY")
    quiet, busy = create(api), create(api)
    reads = FEEDS.reads
    with FEEDS.subscribe(quiet["id"], 2) as feed, FEEDS.subscribe(busy["id"], 2):
        deadline = time.monotonic() + 5
        while FEEDS.reads < reads + 2:  # each new feed's first read is done
            assert time.monotonic() < deadline
            time.sleep(0.01)
        stop = threading.Event()

        def ringing() -> None:  # this process writing the busy task all the time
            while not stop.is_set():
                EVENT_BELL.ring(busy["id"])
                time.sleep(0.005)

        ringer = threading.Thread(target=ringing)
        ringer.start()
        try:
            # Another process's commit: an event numbered under the task's counter, and no
            # ring in this process.
            Task.objects.filter(pk=quiet["id"]).update(next_event_seq=4)
            TaskEvent.objects.create(task_id=quiet["id"], seq=3, type="turn.progress", data={})
            feed.wait(2, 2.0)
            assert [seq for seq, _ in feed.frames_after(2)] == [3]
        finally:
            stop.set()
            ringer.join()
