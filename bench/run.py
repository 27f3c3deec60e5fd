"""Run the benchmark scenarios, one after the other: `make bench` (bench/README.md).

    python bench/run.py [SCENARIO ...] [--quick] [--postgres URL] [--out DIR]

Each scenario runs as its own process (`python bench/<scenario>.py`), prints its table and
writes `<out>/<scenario>.json`; a scenario that fails does not stop the others, and the run
exits non-zero if any did.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import time
from importlib import import_module
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench._suite import RESULTS_DIR, Scenario  # noqa: E402

# In the order they run: the cheapest and most self-contained first.
SCENARIOS = (
    "prompt_core",
    "ingestion",
    "dispatch",
    "dispatch_http",
    "streams",
    "steering",
    "load_profile",
    "faults",
)


def scenario(name: str) -> Scenario:
    found: Scenario = import_module(f"bench.{name}").SCENARIO
    return found


def command(name: str, args: argparse.Namespace) -> list[str]:
    """The scenario's own command line for this run."""
    line = [sys.executable, str(Path(__file__).with_name(f"{name}.py")), "--out", str(args.out)]
    if args.quick:
        line.append("--quick")
    if args.postgres and scenario(name).uses_database:
        line += ["--postgres", args.postgres]
    return line


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "scenarios", nargs="*", metavar="SCENARIO", help=f"of {', '.join(SCENARIOS)} (default: all)"
    )
    parser.add_argument("--quick", action="store_true", help="small sizes: a smoke run")
    parser.add_argument("--postgres", help="PostgreSQL server URL, for scenarios with a database")
    parser.add_argument("--out", type=Path, default=RESULTS_DIR, help="where the JSON goes")
    args = parser.parse_args()
    unknown = [name for name in args.scenarios if name not in SCENARIOS]
    if unknown:
        parser.error(f"unknown scenario {', '.join(unknown)}; known: {', '.join(SCENARIOS)}")
    failed = []
    timings = []
    for name in args.scenarios or SCENARIOS:
        started = time.monotonic()
        if subprocess.run(command(name, args), check=False).returncode:
            failed.append(name)
        timings.append(f"{name} {time.monotonic() - started:.0f} s")
    print(f"\nbench: {'; '.join(timings)}; results in {args.out}")
    if failed:
        raise SystemExit(f"bench: failed: {', '.join(failed)}")


if __name__ == "__main__":
    main()
