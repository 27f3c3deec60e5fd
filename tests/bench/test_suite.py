"""The benchmark suite stays runnable: every scenario the runner names exists and parses its
options, a row judges its target, and a scenario writes the JSON `bench/README.md` describes.
Nothing here times anything."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from bench import run
from bench._suite import Row, at_least, at_most, recorded_option

REPO_ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("name", run.SCENARIOS)
def test_each_scenario_is_a_module_named_as_the_runner_names_it(name):
    scenario = run.scenario(name)

    assert scenario.name == name
    assert scenario.measurements
    assert all(hasattr(scenario.parse([]), option) for option in scenario.quick)


@pytest.mark.parametrize("name", run.SCENARIOS)
def test_each_scenario_answers_help(name):
    answer = subprocess.run(
        [sys.executable, f"bench/{name}.py", "--help"],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        check=False,
    )

    assert answer.returncode == 0, answer.stderr
    assert "--quick" in answer.stdout


def test_an_unknown_scenario_is_refused_by_name():
    answer = subprocess.run(
        [sys.executable, "bench/run.py", "prompt_core", "nonesuch"],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        check=False,
    )

    assert answer.returncode == 2
    assert "unknown scenario nonesuch" in answer.stderr


def test_quick_changes_the_defaults_and_an_option_given_still_wins():
    scenario = run.scenario("prompt_core")

    assert scenario.parse([]).runs == 300
    assert scenario.parse(["--quick"]).runs == scenario.quick["runs"]
    assert scenario.parse(["--quick", "--runs", "7"]).runs == 7


def test_a_measurement_outside_therecorded_option_run_runs_when_its_option_is_given():
    scenario = run.scenario("prompt_core")

    def chosen(*argv):
        return [m.name for m in scenario.chosen(scenario.parse(list(argv)))]

    assert "revisions" not in chosen()
    assert "revisions" in chosen("--against", "HEAD~1")
    assert chosen("--only", "escaping") == ["escaping"]


def test_a_row_compares_with_its_baseline_and_judges_its_target():
    faster = Row("new", 30.0, "ms", "old", 60.0, target=at_most(1.0, of="ratio"))
    slower = Row("new", 90.0, "ms", "old", 60.0, target=at_most(1.0, of="ratio"))
    enough = Row("claims", 320.0, "claims/s", target=at_least(300))
    alone = Row("size", 5.0, "MB")

    assert (faster.ratio, faster.met) == (0.5, True)
    assert (slower.ratio, slower.met) == (1.5, False)
    assert (enough.ratio, enough.met) == (None, True)
    assert (alone.ratio, alone.met) == (None, None)
    assert str(faster.target) == "≤ 1x"
    assert faster.as_json() == {
        "name": "new",
        "value": 30.0,
        "unit": "ms",
        "baseline_name": "old",
        "baseline_value": 60.0,
        "ratio": 0.5,
        "target": "≤ 1x",
        "met": True,
        "note": "",
    }


def test_a_scenario_run_writes_its_rows_with_commit_machine_and_options(tmp_path):
    answer = subprocess.run(
        [
            sys.executable,
            "bench/prompt_core.py",
            "--quick",
            "--only",
            "escaping",
            "--escaping-repeats",
            "2",
            "--out",
            str(tmp_path),
        ],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        check=False,
    )

    assert answer.returncode == 0, answer.stderr
    written = json.loads((tmp_path / "prompt_core.json").read_text())
    assert written["scenario"] == "prompt_core"
    assert len(written["commit"]) >= 40
    assert set(written["machine"]) == {"nproc", "python", "load_average"}
    assert written["options"]["escaping_repeats"] == 2
    assert written["failed"] == []
    assert {row["baseline_name"] for row in written["rows"]} == {"exact prefix"}
    assert all(row["ratio"] > 0 for row in written["rows"])
    assert "escape_content" in answer.stdout


def test_the_results_keep_the_server_url_without_its_password():
    assert recorded_option("postgres", "postgres://bench:secret@db:5432/postgres") == (
        "postgres://bench@db:5432/postgres"
    )
    assert recorded_option("postgres", "postgres://postgres@127.0.0.1:5432/postgres") == (
        "postgres://postgres@127.0.0.1:5432/postgres"
    )
