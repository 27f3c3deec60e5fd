"""Several replicas: two Baton servers, as `make serve` runs them (production mode, gunicorn with
gthread workers), on two ports, sharing one PostgreSQL database and one S3 bucket and nothing
else — each has its own var directory, so a file one writes locally the other never sees.

Over real HTTP, a product and several workers use both servers in turn, as clients behind a
load balancer would: tasks created on one are dispatched and reported on the other, a spilled
text stored by one is read back through the other, a worker waiting on one is woken by a turn
created through the other (PostgreSQL NOTIFY reaches every server process), and a follow-up
through the other server continues the conversation. Every turn is claimed exactly once and
none is lost.

PostgreSQL only: SQLite is one file on one host. The servers use the test database
pytest-django created (already migrated; the API needs no static files, so `make serve`'s
other steps are left out), and the tests run on a transactional database, so what they write
is committed and the servers see it. Times are only checked loosely; latency is
bench/streams.py's (polling).
"""

from __future__ import annotations

import hashlib
import secrets
import socket
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import quote, urlsplit

import httpx
import pytest
from django.contrib.auth import get_user_model
from django.db import connection
from rest_framework.authtoken.models import Token

from backend.dispatch.workers import ensure_worker_account
from backend.tasks.models import Subtask
from tests.api.test_production import production_env
from tests.artifacts.s3 import REGION, Bucket, s3_endpoint  # noqa: F401 - the S3 server fixture
from tests.e2e.live import REPO_ROOT

pytestmark = [
    pytest.mark.e2e,
    pytest.mark.postgres_only,
    pytest.mark.django_db(transaction=True),
    pytest.mark.usefixtures("shipped_bots"),
]

DISPATCH = "/api/executor/dispatch/"
HANG_GUARD_SECONDS = 40
# Over the current message's 32,000-char cap (and so the 16,000-char spill threshold): the
# prompt carries a cut of it, and the manifest the artifact with the whole text.
BUILD_LOG = "".join(f"line {n:05d} of the build log ✓\n" for n in range(1_500))
# Tasks whose first message is a build log (each its own, so each its own artifact).
SPILLED_TASKS = 2
# The answer a worker gives a turn that came with an artifact: long enough to spill too.
LONG_ANSWER_LINES = 1_000


@dataclass(frozen=True)
class Replica:
    name: str
    url: str
    var_dir: Path


@dataclass
class Replicas:
    servers: list[Replica]
    bucket: Bucket

    def other(self, replica: Replica) -> Replica:
        return next(server for server in self.servers if server is not replica)


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def _test_database_url() -> str:
    """The database pytest-django created, as a DATABASE_URL for the servers."""
    db = connection.settings_dict
    credentials = quote(db["USER"] or "", safe="")
    if db["PASSWORD"]:
        credentials += ":" + quote(db["PASSWORD"], safe="")
    host = db["HOST"] or "127.0.0.1"
    port = f":{db['PORT']}" if db["PORT"] else ""
    return f"postgres://{credentials}@{host}{port}/{quote(db['NAME'], safe='')}"


def _wait_until_healthy(replica: Replica, server: subprocess.Popen[bytes]) -> None:
    """Until `/api/health/` answers 200: the database answers and the bucket takes a write."""
    deadline = time.monotonic() + HANG_GUARD_SECONDS
    while True:
        try:
            if httpx.get(f"{replica.url}/api/health/", timeout=5).status_code == 200:
                return
        except httpx.TransportError:
            pass
        if server.poll() is not None or time.monotonic() > deadline:
            errors = (replica.var_dir / "stderr.log").read_text(errors="replace")[-3000:]
            raise AssertionError(f"replica {replica.name} did not come up:\n{errors}")
        time.sleep(0.2)


@pytest.fixture(scope="module")
def replicas(django_db_setup, s3_endpoint: str, tmp_path_factory) -> Iterator[Replicas]:  # noqa: F811
    """Two servers on the test database and one new bucket, each with its own var directory,
    the same SECRET_KEY (as replicas behind one load balancer need)."""
    import boto3

    bucket_name = f"baton-{uuid.uuid4().hex[:12]}"
    dummy_credentials = {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing"}
    client = boto3.client(
        "s3",
        endpoint_url=s3_endpoint,
        region_name=REGION,
        aws_access_key_id=dummy_credentials["AWS_ACCESS_KEY_ID"],
        aws_secret_access_key=dummy_credentials["AWS_SECRET_ACCESS_KEY"],
    )
    client.create_bucket(Bucket=bucket_name)
    shared = {
        "SECRET_KEY": secrets.token_urlsafe(50),
        "BATON_SSL_REDIRECT": "false",  # plain HTTP on loopback
        "DATABASE_URL": _test_database_url(),
        "BATON_ARTIFACT_STORAGE": "s3",
        "BATON_S3_BUCKET": bucket_name,
        "BATON_S3_ENDPOINT_URL": s3_endpoint,
        "BATON_S3_REGION": REGION,
        **dummy_credentials,
        "AWS_SESSION_TOKEN": "testing",
        "AWS_EC2_METADATA_DISABLED": "true",
        "AWS_CONFIG_FILE": "/dev/null",
        "AWS_SHARED_CREDENTIALS_FILE": "/dev/null",
        "BATON_LOG_LEVEL": "WARNING",
    }
    started: list[tuple[Replica, subprocess.Popen[bytes]]] = []
    try:
        for name in ("A", "B"):
            var_dir = tmp_path_factory.mktemp(f"replica-{name}")
            env = production_env(var_dir, **shared)
            env.pop("AWS_PROFILE", None)
            port = _free_port()
            with (
                (var_dir / "stdout.log").open("wb") as out,
                (var_dir / "stderr.log").open("wb") as err,
            ):
                server = subprocess.Popen(
                    [sys.executable, "-m", "gunicorn", "backend.wsgi"]
                    + ["--config", "python:backend.gunicorn_conf"]
                    + ["--bind", f"127.0.0.1:{port}", "--workers", "1", "--threads", "8"],
                    cwd=REPO_ROOT,
                    env=env,
                    stdout=out,
                    stderr=err,
                )
            replica = Replica(name, f"http://127.0.0.1:{port}", var_dir)
            started.append((replica, server))
        for replica, server in started:
            _wait_until_healthy(replica, server)
        yield Replicas(
            servers=[replica for replica, _ in started],
            bucket=Bucket(name=bucket_name, endpoint_url=s3_endpoint, client=client),
        )
    finally:
        for _, server in started:
            server.terminate()
        for _, server in started:
            try:
                server.wait(timeout=HANG_GUARD_SECONDS)
            except subprocess.TimeoutExpired:
                server.kill()
                server.wait()


@dataclass
class Clients:
    """One account's HTTP clients, one per replica (a client's own connection to each)."""

    by_replica: dict[str, httpx.Client]
    replicas: Replicas

    def on(self, replica: Replica) -> httpx.Client:
        return self.by_replica[replica.name]

    def close(self) -> None:
        for client in self.by_replica.values():
            client.close()


def _clients(replicas: Replicas, token: str) -> Clients:
    return Clients(
        by_replica={
            replica.name: httpx.Client(
                base_url=replica.url,
                headers={"Authorization": f"Token {token}"},
                timeout=HANG_GUARD_SECONDS,
            )
            for replica in replicas.servers
        },
        replicas=replicas,
    )


@pytest.fixture
def product(replicas: Replicas) -> Iterator[Clients]:
    owner = get_user_model().objects.create_user(username="product")
    clients = _clients(replicas, Token.objects.create(user=owner).key)
    yield clients
    clients.close()


@pytest.fixture
def worker_clients(replicas: Replicas) -> Iterator[list[Clients]]:
    """Four worker accounts' clients."""
    workers = [
        _clients(replicas, ensure_worker_account(username=f"worker-{index}")[1])
        for index in range(4)
    ]
    yield workers
    for clients in workers:
        clients.close()


# --- what a product and a worker do over HTTP ---------------------------------------------------


def create_task(client: httpx.Client, message: str, title: str = "replicas") -> dict[str, Any]:
    body = {"title": title, "task_type": "code", "executor": "codex", "message": message}
    response = client.post("/api/tasks/", json=body)
    assert response.status_code == 201, response.text
    return response.json()


def get_task(client: httpx.Client, task_id: int) -> dict[str, Any]:
    response = client.get(f"/api/tasks/{task_id}/")
    assert response.status_code == 200, response.text
    return response.json()


def whole_text(client: httpx.Client, spilled: dict[str, Any]) -> str:
    """The whole text behind a preview object, fetched from `client`'s replica (the object's
    url names the replica that built it)."""
    assert spilled["truncated"] is True, spilled
    parts = urlsplit(spilled["url"])
    response = client.get(parts.path + (f"?{parts.query}" if parts.query else ""))
    assert response.status_code == 200, response.text
    return response.content.decode("utf-8")


def dispatch(
    client: httpx.Client, *, worker_id: str, wait_seconds: float = 0
) -> list[dict[str, Any]]:
    body = {"kinds": ["codex"], "limit": 1, "worker_id": worker_id, "wait_seconds": wait_seconds}
    response = client.post(DISPATCH, json=body, timeout=wait_seconds + HANG_GUARD_SECONDS)
    assert response.status_code == 200, response.text
    turns: list[dict[str, Any]] = response.json()["turns"]
    return turns


def report(
    client: httpx.Client, turn: dict[str, Any], *, worker_id: str, value: str, session: str = ""
) -> None:
    response = client.post(
        f"/api/executor/subtasks/{turn['subtask_id']}/result/",
        json={
            "worker_id": worker_id,
            "attempt": turn["attempt"],
            "status": "COMPLETED",
            "result": {"value": value},
            "native_session_id": session,
        },
    )
    assert response.status_code == 200, response.text
    assert response.json()["changed"] is True


def fetch_artifact(client: httpx.Client, entry: dict[str, Any]) -> str:
    """A manifest entry's artifact, sha256-checked as the worker checks it."""
    response = client.get(f"/api/artifacts/{entry['id']}/content/")
    assert response.status_code == 200, response.text
    assert hashlib.sha256(response.content).hexdigest() == entry["sha256"]
    return response.content.decode("utf-8")


def build_log(number: int) -> str:
    return f"{BUILD_LOG}build {number} failed"


def answer_of(turn: dict[str, Any]) -> str:
    if turn["artifacts"]:
        lines = (f"answer line {n} for turn {turn['subtask_id']}" for n in range(LONG_ANSWER_LINES))
        return "\n".join(lines)
    return f"answer for turn {turn['subtask_id']}"


def value_of(client: httpx.Client, assistant: dict[str, Any]) -> str:
    value = assistant["result"]["value"]
    return value if isinstance(value, str) else whole_text(client, value)


def local_files(replicas: Replicas) -> list[Path]:
    """Files under the replicas' var directories other than their logs and static files."""
    return [
        path
        for replica in replicas.servers
        for path in replica.var_dir.rglob("*")
        if path.is_file() and path.suffix != ".log" and "static" not in path.parts
    ]


# --- workers ------------------------------------------------------------------------------------


@dataclass
class Ledger:
    """What the workers claimed and reported, across their threads."""

    claims: list[tuple[int, str, int]] = field(default_factory=list)  # subtask, worker, attempt
    answers: dict[int, str] = field(default_factory=dict)
    artifacts_read: dict[str, str] = field(default_factory=dict)  # id -> whole text
    errors: list[Exception] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)


def work(clients: Clients, *, worker_id: str, ledger: Ledger, stop: threading.Event) -> None:
    """A worker alternating replicas: dispatch on one (waiting a second when there is nothing),
    read the turn's artifacts and report through the other, until `stop`."""
    servers = clients.replicas.servers
    call = int(worker_id.removeprefix("w"))
    try:
        while not stop.is_set():
            dispatching = servers[call % len(servers)]
            reporting = clients.replicas.other(dispatching)
            call += 1
            for turn in dispatch(clients.on(dispatching), worker_id=worker_id, wait_seconds=1):
                with ledger.lock:
                    ledger.claims.append((turn["subtask_id"], worker_id, turn["attempt"]))
                for entry in turn["artifacts"]:
                    text = fetch_artifact(clients.on(reporting), entry)
                    with ledger.lock:
                        ledger.artifacts_read[entry["id"]] = text
                value = answer_of(turn)
                report(clients.on(reporting), turn, worker_id=worker_id, value=value)
                with ledger.lock:
                    ledger.answers[turn["subtask_id"]] = value
    except Exception as error:  # noqa: BLE001 - the test asserts there were none
        with ledger.lock:
            ledger.errors.append(error)


# --- the tests ----------------------------------------------------------------------------------


def test_tasks_through_both_replicas_are_each_claimed_once_and_all_answered(
    replicas, product, worker_clients
):
    a, b = replicas.servers
    ledger = Ledger()
    stop = threading.Event()
    threads = [
        threading.Thread(
            target=work,
            args=(clients,),
            kwargs={"worker_id": f"w{index}", "ledger": ledger, "stop": stop},
        )
        for index, clients in enumerate(worker_clients)
    ]
    for thread in threads:
        thread.start()
    try:
        # The product alternates replicas while the workers run; the first tasks spill.
        created = []
        for number in range(16):
            replica = (a, b)[number % 2]
            message = build_log(number) if number < SPILLED_TASKS else f"job {number}"
            created.append((replica, create_task(product.on(replica), message, f"t{number}")))
        expected = {task["turns"][1]["id"] for _, task in created}
        deadline = time.monotonic() + HANG_GUARD_SECONDS
        while len(ledger.answers) < len(expected) and not ledger.errors:
            assert time.monotonic() < deadline, f"answered {len(ledger.answers)} of {expected}"
            time.sleep(0.1)
    finally:
        stop.set()
        for thread in threads:
            thread.join(timeout=HANG_GUARD_SECONDS)
    assert not ledger.errors, ledger.errors

    # Exactly once: every turn claimed by one worker, on its first attempt; none lost.
    claimed = [subtask_id for subtask_id, _, _ in ledger.claims]
    assert sorted(claimed) == sorted(expected)
    assert {attempt for _, _, attempt in ledger.claims} == {1}
    assert Subtask.objects.filter(role="ASSISTANT").count() == len(expected)
    # Each task, read through the replica that did not create it, holds the reported answer.
    for number, (creator, created_task) in enumerate(created):
        reader = product.on(replicas.other(creator))
        task = get_task(reader, created_task["id"])
        assert task["status"] == "COMPLETED"
        user, assistant = task["turns"]
        assert (user["status"], assistant["status"]) == ("COMPLETED", "COMPLETED")
        assert assistant["attempts"] == 1
        assert value_of(reader, assistant) == ledger.answers[assistant["id"]]
        if number < SPILLED_TASKS:
            # The spilled message: whole through the other replica, from the shared bucket.
            assert whole_text(reader, user["message"]) == build_log(number)
            assert isinstance(assistant["result"]["value"], dict)  # the answer spilled too
    # The workers read the spilled messages' artifacts, whole, through the other replica.
    spilled = [build_log(number) for number in range(SPILLED_TASKS)]
    assert sorted(ledger.artifacts_read.values()) == spilled
    # Stored in the bucket (2 messages, 2 answers, at least), never on a replica's disk.
    assert len(replicas.bucket.object_keys()) >= 4
    assert local_files(replicas) == []


@pytest.mark.parametrize("waiting_on", [0, 1], ids=["waits-on-A", "waits-on-B"])
def test_a_worker_waiting_on_one_replica_gets_a_turn_created_through_the_other(
    replicas, product, worker_clients, waiting_on
):
    wait_seconds = 20.0
    waiting = replicas.servers[waiting_on]
    creating = replicas.other(waiting)
    worker = worker_clients[0]
    answer: dict[str, Any] = {}

    def wait() -> None:
        try:
            answer["turns"] = dispatch(
                worker.on(waiting), worker_id="waiter", wait_seconds=wait_seconds
            )
            answer["at"] = time.monotonic()
        except Exception as error:  # noqa: BLE001 - the test asserts there was none
            answer["error"] = error

    waiter = threading.Thread(target=wait)
    started = time.monotonic()
    waiter.start()
    time.sleep(1.0)  # long enough for a loaded machine to have the request waiting
    task = create_task(product.on(creating), "CI is red.")
    waiter.join(timeout=wait_seconds + HANG_GUARD_SECONDS)
    assert "error" not in answer, answer
    [turn] = answer["turns"]
    assert turn["subtask_id"] == task["turns"][1]["id"]
    # Woken by the other replica's NOTIFY, well before the wait would have ended.
    assert answer["at"] - started < wait_seconds / 2

    report(worker.on(creating), turn, worker_id="waiter", value="fixed")
    done = get_task(product.on(waiting), task["id"])
    assert (done["status"], done["turns"][1]["result"]["value"]) == ("COMPLETED", "fixed")


def test_a_follow_up_through_the_other_replica_continues_the_conversation(
    replicas, product, worker_clients
):
    a, b = replicas.servers
    worker = worker_clients[0]
    task = create_task(product.on(a), "The upload test fails one run in ten.")
    [first] = dispatch(worker.on(b), worker_id="w0")
    assert first["prompt"] == "The upload test fails one run in ten."
    report(worker.on(a), first, worker_id="w0", value="It shares a tmp dir.", session="thread-1")

    response = product.on(b).post(
        f"/api/tasks/{task['id']}/messages/", json={"message": "Add a regression test."}
    )
    assert response.status_code == 201, response.text
    follow_up = response.json()[-1]
    [second] = dispatch(worker.on(a), worker_id="w0")
    assert second["subtask_id"] == follow_up["id"]
    # The whole conversation, written through both replicas, reaches the worker.
    assert second["prompt"] == (
        "## Conversation History\n\n"
        "User:\nThe upload test fails one run in ten.\n\n"
        "Assistant:\nIt shares a tmp dir.\n\n"
        "## Current Message\n\n"
        "User:\nAdd a regression test.\n"
    )
    # The native session the first report named is offered with the follow-up.
    assert second["native_session"]["id"] == "thread-1"
    assert "Add a regression test." in second["resume_prompt"]
    assert "It shares a tmp dir." not in second["resume_prompt"]
    report(worker.on(b), second, worker_id="w0", value="Added test_upload_isolated.")

    done = get_task(product.on(a), task["id"])
    assert done["status"] == "COMPLETED"
    assert [(turn["role"], turn["status"]) for turn in done["turns"]] == [
        ("USER", "COMPLETED"),
        ("ASSISTANT", "COMPLETED"),
        ("USER", "COMPLETED"),
        ("ASSISTANT", "COMPLETED"),
    ]
    assert done["turns"][3]["result"]["value"] == "Added test_upload_isolated."
