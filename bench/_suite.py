"""What every benchmark scenario shares: its rows, its command line, the table it prints and the
JSON it writes.

A scenario (`bench/prompt_core.py`, …) is a set of measurements. Each measurement runs in a
fresh process (Django reads its database settings once a process, and each measurement makes
its own throwaway database) and returns rows: a figure, and beside it the baseline it was
measured against in the same run (interleaved, on the same noise) and the target the issues or
`bench/README.md` state. The scenario prints every row in one table and writes them, with the
commit, the machine and the options, to `bench/results/<scenario>.json` (or `--out DIR`).
Nothing here asserts a timing.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import platform
import queue as queues
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from importlib import import_module
from pathlib import Path
from typing import Any, Literal
from urllib.parse import urlsplit, urlunsplit

REPO_ROOT = Path(__file__).resolve().parent.parent
RESULTS_DIR = REPO_ROOT / "bench" / "results"


@dataclass(frozen=True)
class Target:
    """A goal an issue or `bench/README.md` states: the row's value (or its ratio to the
    baseline) at most, or at least, `limit`."""

    limit: float
    at_most: bool
    of: Literal["value", "ratio"] = "value"

    def met(self, row: Row) -> bool | None:
        measured = row.value if self.of == "value" else row.ratio
        if measured is None:
            return None
        return measured <= self.limit if self.at_most else measured >= self.limit

    def __str__(self) -> str:
        unit = "x" if self.of == "ratio" else ""
        return f"{'≤' if self.at_most else '≥'} {self.limit:g}{unit}"


def at_most(limit: float, *, of: Literal["value", "ratio"] = "value") -> Target:
    return Target(limit=limit, at_most=True, of=of)


def at_least(limit: float, *, of: Literal["value", "ratio"] = "value") -> Target:
    return Target(limit=limit, at_most=False, of=of)


@dataclass(frozen=True)
class Row:
    """One figure of a run, with the baseline it was measured against (same run, same unit)."""

    name: str
    value: float
    unit: str
    baseline_name: str | None = None
    baseline_value: float | None = None
    target: Target | None = None
    note: str = ""

    @property
    def ratio(self) -> float | None:
        if self.baseline_value is None or self.baseline_value == 0:
            return None
        return self.value / self.baseline_value

    @property
    def met(self) -> bool | None:
        return None if self.target is None else self.target.met(self)

    def as_json(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "value": self.value,
            "unit": self.unit,
            "baseline_name": self.baseline_name,
            "baseline_value": self.baseline_value,
            "ratio": self.ratio,
            "target": None if self.target is None else str(self.target),
            "met": self.met,
            "note": self.note,
        }


@dataclass
class ScenarioResult:
    """A scenario's run: what was measured where, with which options, and its rows."""

    scenario: str
    commit: str
    date: str
    machine: dict[str, Any]
    options: dict[str, Any]
    rows: list[Row] = field(default_factory=list)
    failed: list[str] = field(default_factory=list)
    seconds: float = 0.0

    def as_json(self) -> dict[str, Any]:
        data = asdict(self)
        data["rows"] = [row.as_json() for row in self.rows]
        return data


Measure = Callable[[argparse.Namespace], list[Row]]


@dataclass(frozen=True)
class Measurement:
    """One measurement of a scenario. `default`: part of the scenario's plain run; `when`: an
    option that, given, adds it to the plain run; `postgres_only`: skipped on SQLite."""

    name: str
    measure: Measure
    default: bool = True
    when: str | None = None
    postgres_only: bool = False


@dataclass(frozen=True)
class Scenario:
    """A benchmark scenario: its measurements, their options and the sizes `--quick` uses."""

    name: str
    summary: str
    measurements: tuple[Measurement, ...]
    add_arguments: Callable[[argparse.ArgumentParser], None]
    quick: dict[str, Any]
    uses_database: bool = True

    def parser(self) -> argparse.ArgumentParser:
        parser = argparse.ArgumentParser(
            prog=f"bench/{self.name}.py",
            description=self.summary,
            formatter_class=argparse.ArgumentDefaultsHelpFormatter,
        )
        names = [measurement.name for measurement in self.measurements]
        parser.add_argument(
            "--only",
            nargs="+",
            choices=names,
            metavar="MEASUREMENT",
            help=f"run these measurements only (of {', '.join(names)}); "
            f"default: {', '.join(m.name for m in self.measurements if m.default)}",
        )
        parser.add_argument(
            "--quick", action="store_true", help="small sizes and few repeats: a smoke run"
        )
        parser.add_argument("--out", type=Path, default=RESULTS_DIR, help="where the JSON goes")
        if self.uses_database:
            parser.add_argument(
                "--postgres",
                help="PostgreSQL server URL; a throwaway database is made there (default: SQLite)",
            )
        self.add_arguments(parser)
        return parser

    def parse(self, argv: Sequence[str] | None = None) -> argparse.Namespace:
        parser = self.parser()
        if "--quick" in (sys.argv[1:] if argv is None else argv):
            parser.set_defaults(**self.quick)
        args = parser.parse_args(argv)
        if not self.uses_database:
            args.postgres = None
        return args

    def chosen(self, args: argparse.Namespace) -> list[Measurement]:
        if args.only:
            return [m for m in self.measurements if m.name in args.only]
        return [
            m for m in self.measurements if m.default or (m.when and getattr(args, m.when, None))
        ]

    def main(self, argv: Sequence[str] | None = None) -> ScenarioResult:
        """Run the chosen measurements, each in a fresh process; print and write the rows."""
        args = self.parse(argv)
        started = time.monotonic()
        result = ScenarioResult(
            scenario=self.name,
            commit=_commit(),
            date=datetime.now(UTC).isoformat(timespec="seconds"),
            machine=_machine(),
            options={key: recorded_option(key, value) for key, value in vars(args).items()},
        )
        for measurement in self.chosen(args):
            if measurement.postgres_only and not args.postgres:
                print(f"[{self.name}] {measurement.name}: skipped, it needs --postgres URL")
                continue
            print(f"[{self.name}] measuring {measurement.name} …", flush=True)
            rows = _in_fresh_process(self.name, measurement.name, args)
            if rows is None:
                result.failed.append(measurement.name)
            else:
                result.rows += rows
        result.seconds = time.monotonic() - started
        print_table(result)
        args.out.mkdir(parents=True, exist_ok=True)
        path = args.out / f"{self.name}.json"
        path.write_text(json.dumps(result.as_json(), indent=2) + "\n", encoding="utf-8")
        print(f"written: {path}")
        if result.failed:
            raise SystemExit(f"{self.name}: failed: {', '.join(result.failed)}")
        return result


def _in_fresh_process(
    scenario: str, measurement: str, args: argparse.Namespace
) -> list[Row] | None:
    """The measurement's rows, measured in a new interpreter; None if it failed there."""
    context = multiprocessing.get_context("spawn")
    receiver, sender = context.Pipe(duplex=False)
    process = context.Process(target=_measure, args=(scenario, measurement, args, sender))
    process.start()
    sender.close()
    try:
        rows = receiver.recv()
    except EOFError:  # it failed before sending its rows
        rows = None
    process.join()
    return rows if process.exitcode == 0 else None


def _measure(scenario: str, measurement: str, args: argparse.Namespace, sender: Any) -> None:
    module = import_module(f"bench.{scenario}")
    [chosen] = [m for m in module.SCENARIO.measurements if m.name == measurement]
    try:
        sender.send(chosen.measure(args))
    finally:
        sender.close()


def _commit() -> str:
    def git(*command: str) -> str:
        return subprocess.run(
            ["git", *command], cwd=REPO_ROOT, capture_output=True, text=True, check=False
        ).stdout.strip()

    sha = git("rev-parse", "HEAD") or "unknown"
    return f"{sha}-dirty" if git("status", "--porcelain", "--untracked-files=no") else sha


def _machine() -> dict[str, Any]:
    return {
        "nproc": os.cpu_count(),
        "python": platform.python_version(),
        "load_average": [round(value, 2) for value in os.getloadavg()],
    }


def recorded_option(option: str, value: Any) -> Any:
    """An option's value as the JSON keeps it: a path as text, the server URL without its
    password."""
    if isinstance(value, Path):
        return str(value)
    if option == "postgres" and value:
        parts = urlsplit(value)
        if parts.password:
            host = parts.netloc.rsplit("@", 1)[1]
            return urlunsplit(parts._replace(netloc=f"{parts.username}@{host}"))
    return value


def _number(value: float | None, unit: str = "") -> str:
    if value is None:
        return "-"
    if unit == "%":
        return f"{value:.1f} %"
    size = abs(value)
    whole = size >= 100 or float(value).is_integer()
    text = f"{value:,.0f}" if whole else f"{value:.2f}" if size >= 1 else f"{value:.3g}"
    return f"{text} {unit}".rstrip()


def print_table(result: ScenarioResult) -> None:
    """Every row: the figure, its baseline, their ratio, the target and whether it is met."""
    load = ", ".join(f"{value:g}" for value in result.machine["load_average"])
    print(
        f"\n{result.scenario} — {result.commit[:12]}, {result.date}, "
        f"{result.machine['nproc']} CPUs, Python {result.machine['python']}, load {load}, "
        f"{result.seconds:.0f} s"
    )
    if result.options.get("quick"):
        print("  --quick: sizes for a smoke run, too small to hold the figures to their targets")
    header = ("measurement", "value", "baseline", "baseline value", "ratio", "target", "")
    lines = [header]
    for row in result.rows:
        ratio = row.ratio
        lines.append(
            (
                row.name,
                _number(row.value, row.unit),
                row.baseline_name or "",
                _number(row.baseline_value, row.unit) if row.baseline_name else "",
                f"{ratio:.2f}x" if ratio is not None else "",
                str(row.target) if row.target else "",
                {True: "met", False: "MISSED", None: ""}[row.met],
            )
        )
    widths = [max(len(line[column]) for line in lines) for column in range(len(header))]
    for line in lines:
        print("  ".join(cell.ljust(width) for cell, width in zip(line, widths, strict=True)))
    for row in result.rows:
        if row.note:
            print(f"  {row.name}: {row.note}")


def interleaved_ms(runs: Sequence[Callable[[], object]], repeats: int) -> list[list[float]]:
    """Wall times (ms) of each of `runs` after one warm-up run each, alternating them run by
    run so that they share the machine's noise."""
    for run in runs:
        run()
    samples: list[list[float]] = [[] for _ in runs]
    for _ in range(repeats):
        for run, times in zip(runs, samples, strict=True):
            started = time.perf_counter_ns()
            run()
            times.append((time.perf_counter_ns() - started) / 1e6)
    return samples


def quantile(values: Sequence[float], fraction: float) -> float:
    """The value `fraction` of the way up the sorted values (nan for none)."""
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(fraction * len(ordered)))]


def results_of(processes: Sequence[Any], queue: Any) -> list[Any]:
    """The one result each of `processes` puts on `queue`; one that dies without its result
    fails the measurement rather than leaving it waiting."""
    results: list[Any] = []
    while len(results) < len(processes):
        try:
            results.append(queue.get(timeout=1))
        except queues.Empty:
            if any(process.exitcode not in (None, 0) for process in processes):
                raise SystemExit("a client process failed (its error is above)") from None
    return results
