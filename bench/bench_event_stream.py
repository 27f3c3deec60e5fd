"""Live task events: how fast a progress report reaches its listeners, with many listening.

Run from the repository root (PostgreSQL is the target; SQLite works for comparison):

    .venv/bin/python bench/bench_event_stream.py --postgres postgres://postgres@127.0.0.1:5432/postgres

Baton runs under gunicorn (2 processes, each with a thread per listener, since the kernel may
hand either process every connection, and 10 more for the API; BATON_MAX_EVENT_STREAMS set to
match) on a throwaway database. On PostgreSQL a stream holds a database connection only until
it has caught up (then its process's feed reads for it), so the listeners connect 16 at a time.
The listeners are coroutines on one event loop in this process, reading the raw chunked
responses: a thread per listener would spend this machine's two cores on the clients.
`--tasks` (8) tasks, each with `--listeners` / tasks clients following
`GET /api/tasks/{id}/events/` (200 in all), and one worker per task that claims its turn and
posts `--reports` progress reports (`POST /api/executor/subtasks/{id}/progress/`, one every
`--interval` seconds, each adding a numbered piece of text) and then its result.

- Latency: for every progress event every listener of its task receives, the time from sending
  the report to the listener reading the event (all clients in this process, one clock).
- Exactly once: each listener's event ids are checked to run 1, 2, 3, … with no gap and no
  duplicate, and every report reaches every listener of its task.
- Idle cost: with every listener connected and nothing happening, the CPU time the gunicorn
  processes use over `--idle-seconds`.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import statistics
import sys
import threading
import time
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench._django import bench_database  # noqa: E402
from bench._live import LiveBaton, live_baton, server_cpu_seconds  # noqa: E402

SERVER_PROCESSES = 2
CONNECTING_AT_ONCE = 16


class Listener:
    """One client following a task's events; records when each progress piece arrived.

    Listeners are coroutines on one event loop (`Listeners`), reading the raw HTTP/1.1 chunked
    response: 200 client threads would compete for this machine's two cores with the server
    they measure, and so would a heavier client library per chunk."""

    def __init__(self, baton: LiveBaton, task_id: int) -> None:
        self.baton, self.task_id = baton, task_id
        self.ids: list[int] = []
        self.pieces: dict[str, float] = {}
        self.connected = threading.Event()

    async def run(self, connecting: asyncio.Semaphore) -> None:
        """Follow the stream; `connecting` is held until the first event arrives (the server
        has then read the task's past events and sleeps until new ones)."""
        await connecting.acquire()
        url = httpx.URL(self.baton.url)
        reader, writer = await asyncio.open_connection(url.host, url.port)
        writer.write(
            (
                f"GET /api/tasks/{self.task_id}/events/ HTTP/1.1\r\n"
                f"Host: {url.host}:{url.port}\r\n"
                f"Authorization: Token {self.baton.product_token}\r\n"
                "Accept: text/event-stream\r\n\r\n"
            ).encode()
        )
        try:
            head = await reader.readuntil(b"\r\n\r\n")
            if not head.startswith(b"HTTP/1.1 200"):
                raise SystemExit(f"stream answered {head.splitlines()[0]!r}")
            if b"transfer-encoding: chunked" not in head.lower():
                raise SystemExit("the stream is not chunked")
            buffer = ""
            while True:
                size = int((await reader.readline()).strip(), 16)
                if size == 0:
                    return
                chunk = (await reader.readexactly(size + 2))[:-2]
                now = time.monotonic()
                buffer += chunk.decode()
                while "\n\n" in buffer:
                    block, buffer = buffer.split("\n\n", 1)
                    self._frame(block, now)
                if self.ids and not self.connected.is_set():
                    self.connected.set()
                    connecting.release()
        finally:
            writer.close()

    def _frame(self, block: str, now: float) -> None:
        fields = dict(
            line.split(": ", 1) for line in block.split("\n") if line and not line.startswith(":")
        )
        if "id" not in fields:
            return
        self.ids.append(int(fields["id"]))
        data = json.loads(fields["data"])
        for piece in data.get("text", "").split(";"):
            if piece:
                self.pieces[piece] = now


class Listeners(threading.Thread):
    """Every listener, on one event loop in a thread of its own."""

    def __init__(self, listeners: list[Listener]) -> None:
        super().__init__(daemon=True)
        self.listeners = listeners
        self.loop = asyncio.new_event_loop()
        self.running: asyncio.Future | None = None

    def run(self) -> None:
        self.loop.run_until_complete(self._everyone())

    async def _everyone(self) -> None:
        # Listeners connect a few at a time, as clients of a real product do: a stream needs a
        # database connection until it has caught up.
        connecting = asyncio.Semaphore(CONNECTING_AT_ONCE)
        self.running = asyncio.gather(*(listener.run(connecting) for listener in self.listeners))
        with contextlib.suppress(asyncio.CancelledError):  # `stop` closes every connection
            await self.running

    def stop(self) -> None:
        """Hang up every listener (the server then shuts down without waiting for them)."""
        if self.running is not None:
            self.loop.call_soon_threadsafe(self.running.cancel)
        self.join(10)


def work(baton: LiveBaton, index: int, reports: int, interval: float, sent: dict) -> None:
    """One worker: claim a turn, post numbered progress, report the result."""
    headers = {"Authorization": f"Token {baton.worker_token}"}
    worker_id = f"bench-worker-{index}"
    with httpx.Client(base_url=baton.url, headers=headers, timeout=60) as client:
        while True:
            claimed = client.post(
                "/api/executor/dispatch/",
                json={"kinds": ["codex"], "limit": 1, "worker_id": worker_id},
            )
            claimed.raise_for_status()
            if claimed.json()["turns"]:
                break
        turn = claimed.json()["turns"][0]
        claim = {"worker_id": worker_id, "attempt": turn["attempt"]}
        text = ""
        for number in range(reports):
            piece = f"t{turn['task_id']}p{number}"
            text += piece + ";"
            sent[piece] = time.monotonic()
            response = client.post(
                f"/api/executor/subtasks/{turn['subtask_id']}/progress/",
                json={**claim, "events": [{"type": "message"}], "partial_text": text},
            )
            response.raise_for_status()
            time.sleep(interval)
        client.post(
            f"/api/executor/subtasks/{turn['subtask_id']}/result/",
            json={**claim, "status": "COMPLETED", "result": {"value": text}},
        ).raise_for_status()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--postgres", help="a PostgreSQL server URL (a database is created)")
    parser.add_argument("--tasks", type=int, default=8)
    parser.add_argument("--listeners", type=int, default=200)
    parser.add_argument("--reports", type=int, default=50)
    parser.add_argument("--interval", type=float, default=0.1)
    parser.add_argument("--idle-seconds", type=float, default=10.0)
    args = parser.parse_args()
    # The kernel does not spread connections evenly over the processes: each may get them all.
    streams_per_process = args.listeners
    os.environ["BATON_MAX_EVENT_STREAMS"] = str(streams_per_process)
    os.environ["BATON_EVENT_STREAM_SECONDS"] = "3600"
    with (
        bench_database(args.postgres) as vendor,
        live_baton(workers=SERVER_PROCESSES, threads=streams_per_process + 10) as baton,
    ):
        task_ids = []
        for number in range(args.tasks):
            response = baton.product.post(
                "/api/tasks/",
                json={
                    "title": f"t{number}",
                    "task_type": "code",
                    "executor": "codex",
                    "message": "Stream your progress.",
                },
            )
            response.raise_for_status()
            task_ids.append(response.json()["id"])
        listeners = [
            Listener(baton, task_ids[index % args.tasks]) for index in range(args.listeners)
        ]
        everyone = Listeners(listeners)
        everyone.start()
        for listener in listeners:
            if not listener.connected.wait(60):
                raise SystemExit("a listener did not connect")
        time.sleep(1.0)
        before = server_cpu_seconds(baton.server_pid)
        time.sleep(args.idle_seconds)
        idle_cpu = (server_cpu_seconds(baton.server_pid) - before) / args.idle_seconds

        sent: dict[str, float] = {}
        before = server_cpu_seconds(baton.server_pid)
        started = time.monotonic()
        workers = [
            threading.Thread(target=work, args=(baton, index, args.reports, args.interval, sent))
            for index in range(args.tasks)
        ]
        for worker in workers:
            worker.start()
        for worker in workers:
            worker.join()
        deadline = time.monotonic() + 60
        expected = args.reports  # pieces per task
        while any(len(listener.pieces) < expected for listener in listeners):
            if time.monotonic() > deadline:
                missing = sum(expected - len(listener.pieces) for listener in listeners)
                raise SystemExit(f"{missing} progress pieces never reached their listeners")
            time.sleep(0.05)
        busy_seconds = time.monotonic() - started
        busy_cpu = (server_cpu_seconds(baton.server_pid) - before) / busy_seconds
        everyone.stop()
    latencies = sorted(
        (arrived - sent[piece]) * 1000
        for listener in listeners
        for piece, arrived in listener.pieces.items()
    )
    gaps = sum(listener.ids != list(range(1, len(listener.ids) + 1)) for listener in listeners)
    print(
        f"\nTask event streams — {vendor}, gunicorn {SERVER_PROCESSES}x{streams_per_process + 10} "
        f"threads, {args.listeners} listeners on {args.tasks} tasks, {args.reports} progress "
        f"reports per task every {args.interval:g} s\n"
    )
    print(f"deliveries measured        {len(latencies)}")
    print(f"latency p50                {statistics.median(latencies):.1f} ms")
    print(f"latency p90                {latencies[int(0.9 * (len(latencies) - 1))]:.1f} ms")
    print(f"latency max                {latencies[-1]:.1f} ms")
    print(f"listeners with a gap/dup   {gaps}")
    print(f"server CPU, idle listeners {idle_cpu:.1%} of one core")
    print(f"server CPU, streaming      {busy_cpu:.1%} of one core")
    print("\ntarget: latency p50 under 50 ms with 200 listeners and 8 workers")


if __name__ == "__main__":
    main()
