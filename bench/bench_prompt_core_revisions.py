"""Benchmark: this checkout's prompt core against the one of an earlier commit, in one process.

Run from the repository root::

    .venv/bin/python bench/bench_prompt_core_revisions.py --base 3126ddf

The earlier commit's ``backend/prompting`` is exported with ``git archive`` into a temporary
directory and imported under another name, so both cores build the prompt-builder benchmark's
inputs (``bench_prompt_build.py``: 20, 1,000 and 10,000 turns) side by side, interleaved, in
the same process and on the same noise. It prints whether both gave the same text and the
ratio of their medians. Nothing here is a test: no timing is asserted.
"""

from __future__ import annotations

import argparse
import importlib
import io
import statistics
import subprocess
import sys
import tarfile
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

import bench_prompt_build as bench  # noqa: E402

import backend.prompting as current  # noqa: E402

BASE_PACKAGE = "baseline_prompting"


def export_base(revision: str, into: Path) -> Any:
    """The prompt core of ``revision``, importable as ``baseline_prompting``."""
    archive = subprocess.run(
        ["git", "archive", "--format=tar", revision, "backend/prompting"],
        cwd=ROOT,
        capture_output=True,
        check=True,
    ).stdout
    with tarfile.open(fileobj=io.BytesIO(archive)) as tar:
        tar.extractall(into, filter="data")
    package = into / BASE_PACKAGE
    (into / "backend" / "prompting").rename(package)
    for module in package.glob("*.py"):
        module.write_text(module.read_text().replace("backend.prompting", BASE_PACKAGE))
    sys.path.insert(0, str(into))
    return importlib.import_module(BASE_PACKAGE)


def as_base(base: Any, prompt_input: Any) -> tuple[Any, Any]:
    """The same input and policy as the earlier core's own models (names and values differ)."""
    data = prompt_input.model_dump(mode="json")
    # Fields added since the earlier commit are left at their defaults here: drop them.
    data = {key: value for key, value in data.items() if key in base.PromptInput.model_fields}
    data["current"] = {
        key: value
        for key, value in data["current"].items()
        if key in base.CurrentMessage.model_fields
    }
    role_values = {role.name: role.value for role in base.Role}
    for message in data["history"]:
        message["role"] = role_values[message["role"].upper()]
    policy_class = getattr(base, "PromptPolicy", None) or base.HistoryPolicy
    return base.PromptInput.model_validate(data), policy_class.model_validate(
        bench.POLICY.model_dump()
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--base", required=True, help="the commit to compare with")
    parser.add_argument("--repeats", type=int, default=150)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as scratch:
        base = export_base(args.base, Path(scratch))
        cases = {
            f"{turns:,} turns": bench.prompt_input(bench.make_history(turns)[0])
            for turns in (20, 1_000, 10_000)
        }
        print(f"{'history':<13} {'same text':>9} {args.base:>12} {'this':>10} {'ratio':>7}")
        for name, prompt_input in cases.items():
            base_input, base_policy = as_base(base, prompt_input)
            same = (
                base.build_prompt(base_input, base_policy).text
                == current.build_prompt(prompt_input, bench.POLICY).text
            )
            old: list[float] = []
            new: list[float] = []
            for _ in range(args.repeats):
                start = time.perf_counter()
                base.build_prompt(base_input, base_policy)
                old.append(time.perf_counter() - start)
                start = time.perf_counter()
                current.build_prompt(prompt_input, bench.POLICY)
                new.append(time.perf_counter() - start)
            old_ms, new_ms = statistics.median(old) * 1e3, statistics.median(new) * 1e3
            print(
                f"{name:<13} {'yes' if same else 'no':>9} {old_ms:>9.2f} ms {new_ms:>7.2f} ms "
                f"{new_ms / old_ms:>6.2f}x"
            )


if __name__ == "__main__":
    main()
