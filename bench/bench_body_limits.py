"""What an oversized request body costs the server: time to its answer and memory, over HTTP.

Baton runs under gunicorn (one sync worker, so its memory is one process's) on a throwaway
database. A product client posts `POST /api/tasks/` with a message far above
BATON_MAX_MESSAGE_BYTES, over a raw socket that keeps sending the body until the answer's
status line arrives, and stops there: the time is from the first byte sent to that status line.
The server worker's memory is read from /proc: its resident size before the request and its
peak during it (`VmHWM`, reset before each request through `clear_refs`).

    .venv/bin/python bench/bench_body_limits.py                 # 100 MiB message, 3 requests
    .venv/bin/python bench/bench_body_limits.py --mib 100 --requests 3
"""

from __future__ import annotations

import argparse
import json
import select
import socket
import statistics
import sys
import time
from pathlib import Path
from urllib.parse import urlsplit

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench._django import bench_database  # noqa: E402
from bench._live import gunicorn_worker, live_baton, memory_kib, reset_peak  # noqa: E402

SEND_CHUNK = 1 << 20


def _post(url: str, path: str, *, token: str, body: bytes) -> tuple[int, float, int]:
    """Send the request until its answer starts; (status, seconds, body bytes sent)."""
    parts = urlsplit(url)
    head = (
        f"POST {path} HTTP/1.1\r\nHost: {parts.hostname}\r\n"
        f"Authorization: Token {token}\r\nContent-Type: application/json\r\n"
        f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n"
    ).encode("ascii")
    with socket.create_connection((parts.hostname, parts.port)) as sock:
        started = time.perf_counter()
        sock.sendall(head)
        sock.setblocking(False)
        view = memoryview(body)
        sent = 0
        answer = b""
        while b"\r\n" not in answer:
            writers = [sock] if sent < len(body) else []
            readable, writable, _ = select.select([sock], writers, [], 120)
            if readable:
                chunk = sock.recv(65536)
                if not chunk:
                    break
                answer += chunk
            elif writable:
                try:
                    sent += sock.send(view[sent : sent + SEND_CHUNK])
                except (BrokenPipeError, ConnectionResetError):
                    sent = len(body)  # the server stopped reading; its answer is next
            elif not readable:
                raise SystemExit("no answer within 120 s")
        elapsed = time.perf_counter() - started
    status = int(answer.split(b" ", 2)[1]) if answer else 0
    return status, elapsed, sent


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mib", type=int, default=100, help="the message's size in MiB")
    parser.add_argument("--requests", type=int, default=3)
    args = parser.parse_args()

    message = "x" * (args.mib << 20)
    body = json.dumps(
        {"title": "big", "task_type": "code", "executor": "codex", "message": message}
    ).encode("utf-8")
    del message
    with bench_database(None), live_baton(workers=1) as baton:
        worker = gunicorn_worker(baton.server_pid)
        rows = []
        for _ in range(args.requests):
            rss_before = memory_kib(worker, "VmRSS")
            reset_peak(worker)
            status, seconds, sent = _post(
                baton.url, "/api/tasks/", token=baton.product_token, body=body
            )
            time.sleep(0.5)  # let the worker finish with the request before reading its peak
            peak = memory_kib(worker, "VmHWM")
            rows.append((status, seconds, sent, (peak - rss_before) / 1024))
        print(
            f"\nPOST /api/tasks/ with a {args.mib} MiB message ({len(body):,} bytes of JSON), "
            "gunicorn 1 sync worker"
        )
        print(f"{'status':>6}  {'answer after':>12}  {'body sent':>12}  {'peak RSS growth':>15}")
        for status, seconds, sent, growth in rows:
            print(f"{status:>6}  {seconds:>10.3f} s  {sent / 2**20:>8.1f} MiB  {growth:>11.1f} MiB")
        print(
            f"median answer after {statistics.median(r[1] for r in rows):.3f} s, "
            f"largest peak growth {max(r[3] for r in rows):.1f} MiB"
        )


if __name__ == "__main__":
    main()
