"""Kind-aware previews: what they cost at ingestion next to the plain head + tail preview.

Run from the repository root:

    .venv/bin/python bench/bench_previews.py            # ~1 min

For each kind, a text of 1 MB and one of 50 MB (JSON: 1 MB and 8 MB, the largest a skeleton
is built for) is previewed with the plain `make_preview` and with `make_kind_preview`, with the
default 2,000 + 2,000-char budget: median seconds over 5 runs, and tracemalloc's peak extra
memory of the kind-aware preview as a multiple of the text's size. The texts are the worst case
for evidence scans: no evidence between the head and the tail, so the whole middle is searched.
"""

from __future__ import annotations

import json
import statistics
import sys
import time
import tracemalloc
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from backend.prompting.kinds import ArtifactKind  # noqa: E402
from backend.prompting.previews import make_kind_preview  # noqa: E402
from backend.prompting.truncate import make_preview  # noqa: E402

HEAD = TAIL = 2_000
RUNS = 5


def command_output(size: int) -> str:
    body = "compiling module number something ok\n" * (size // 37)
    return "$ make\n" + body + "exit code 0\n"


def search_results(size: int) -> str:
    body = "a snippet line that says nothing special at all\n" * (size // 48)
    return "## Results\nhttps://example.com/first\n" + body + "https://example.com/last\n"


def code(size: int) -> str:
    return "def handler(event):\n    return process(event)\n\n" * (size // 47)


def json_text(size: int) -> str:
    items = [{"id": n, "name": f"item {n}", "tags": ["a", "b"]} for n in range(size // 61)]
    return json.dumps({"items": items, "count": len(items)})


def timed(function: Callable[[], object]) -> float:
    timings = []
    for _ in range(RUNS):
        start = time.perf_counter()
        function()
        timings.append(time.perf_counter() - start)
    return statistics.median(timings)


def peak_ratio(function: Callable[[], object], size: int) -> float:
    tracemalloc.start()
    function()
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    return peak / size


def main() -> None:
    cases = [
        (ArtifactKind.COMMAND_OUTPUT, command_output, (1_000_000, 50_000_000)),
        (ArtifactKind.WEB_OR_SEARCH, search_results, (1_000_000, 50_000_000)),
        (ArtifactKind.FILE_OR_CODE, code, (1_000_000, 50_000_000)),
        (ArtifactKind.JSON, json_text, (1_000_000, 8_000_000)),
    ]
    print("| kind | size | plain preview | kind-aware preview | peak extra memory |")
    print("|---|---|---|---|---|")
    for kind, make, sizes in cases:
        for size in sizes:
            text = make(size)
            plain = timed(lambda text=text: make_preview(text, head_chars=HEAD, tail_chars=TAIL))
            aware = timed(
                lambda text=text, kind=kind: make_kind_preview(
                    text, kind, head_chars=HEAD, tail_chars=TAIL
                )
            )
            peak = peak_ratio(
                lambda text=text, kind=kind: make_kind_preview(
                    text, kind, head_chars=HEAD, tail_chars=TAIL
                ),
                len(text),
            )
            print(
                f"| {kind.value} | {len(text) / 1e6:.1f} M chars | {plain * 1e3:.3f} ms "
                f"| {aware * 1e3:.1f} ms | {peak:.3f}x |"
            )


if __name__ == "__main__":
    main()
