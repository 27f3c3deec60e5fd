"""The worker's registry of executor kinds: each entry runs its adapter, reaches its model, and
names a kind the backend knows."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from executors.adapters import adapter_for
from executors.cli import model_endpoints
from executors.config import load_settings
from executors.kinds import EXECUTOR_KINDS, KINDS, PROVIDERS, ExecutorKind
from executors.standin import anthropic_messages, openai_chat, openai_responses

REPO_ROOT = Path(__file__).resolve().parents[2]
BASE_ENV = {"BATON_URL": "http://127.0.0.1:8000", "BATON_WORKER_TOKEN": "tok"}


@pytest.mark.parametrize("name", EXECUTOR_KINDS)
def test_each_kind_names_its_own_adapter(name):
    adapter = adapter_for(name)
    assert adapter.kind == name
    assert type(adapter) is not type(adapter_for(next(n for n in EXECUTOR_KINDS if n != name)))


def test_an_adapter_of_another_kind_is_refused():
    wrong = ExecutorKind(
        name="gemini",
        adapter="executors.adapters.codex:CodexAdapter",
        provider=PROVIDERS[0],
        standin_api=openai_responses.API,
    )
    with pytest.raises(TypeError, match="not the adapter of gemini"):
        wrong.new_adapter()
    with pytest.raises(ValueError, match="unknown executor kind 'gemini'"):
        adapter_for("gemini")


def test_each_kind_speaks_a_wire_the_stand_in_answers_and_a_listed_provider():
    wires = {openai_responses.API, openai_chat.API, anthropic_messages.API}
    for kind in KINDS.values():
        assert kind.standin_api in wires
        assert kind.provider in PROVIDERS


def test_a_worker_serves_every_kind_unless_told_otherwise(tmp_path):
    settings = load_settings([], {**BASE_ENV, "BATON_WORKSPACE_ROOT": str(tmp_path)})
    assert settings.kinds == EXECUTOR_KINDS


def test_each_kind_reaches_the_stand_in_at_its_providers_path(tmp_path):
    settings = load_settings(
        ["--standin-model", "always"], {**BASE_ENV, "BATON_WORKSPACE_ROOT": str(tmp_path)}
    )
    endpoints = model_endpoints(settings, standin_url="http://127.0.0.1:9")
    for name, kind in KINDS.items():
        assert endpoints[name].base_url == "http://127.0.0.1:9" + kind.provider.standin_path


def test_each_kind_reads_its_providers_own_variables(tmp_path):
    env = {**BASE_ENV, "BATON_WORKSPACE_ROOT": str(tmp_path)}
    for provider in PROVIDERS:
        env[provider.base_url_variable] = f"https://{provider.name}.example/v1"
        env[provider.api_key_variable] = f"key-{provider.name}"
    endpoints = model_endpoints(load_settings([], env), standin_url=None)
    for name, kind in KINDS.items():
        endpoint = endpoints[name]
        assert endpoint.base_url == f"https://{kind.provider.name}.example/v1"
        assert endpoint.api_key == f"key-{kind.provider.name}"


def test_a_worker_loads_only_the_adapters_of_the_kinds_it_serves():
    script = (
        "import sys\n"
        "from executors.adapters import adapter_for\n"
        "adapter_for('codex')\n"
        "assert 'executors.adapters.codex' in sys.modules\n"
        "assert 'executors.adapters.claude_code' not in sys.modules\n"
        "assert 'executors.adapters.agno' not in sys.modules\n"
    )
    subprocess.run([sys.executable, "-c", script], cwd=REPO_ROOT, check=True)


def test_the_worker_and_the_backend_name_the_same_kinds():
    from backend import executor_kinds

    assert EXECUTOR_KINDS == executor_kinds.NAMES
