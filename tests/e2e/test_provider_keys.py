"""End to end: no process an agent can run or read holds a provider key.

The real worker, started as an operator starts it — both providers' keys in its environment —
runs a turn whose agent walks every ancestor of its command up to process 1 and writes down
each one's environment (`/proc/<pid>/environ`: the environment a process started with) and
command line. Neither key is there: the worker re-executed itself without them, and each
executor talks to the worker's credential proxy with a token of its run's own
(`executors.credentials`), which the proxy refuses once the run has ended. The model server
still received the real key, which the proxy added.
"""

from __future__ import annotations

import re

import httpx
import pytest

from executors.kinds import EXECUTOR_KINDS
from tests.e2e.live import worker
from tests.e2e.test_executors import tool_call

pytestmark = [
    pytest.mark.e2e,
    pytest.mark.django_db(transaction=True),
    pytest.mark.usefixtures("shipped_bots"),
]

OPENAI_KEY, ANTHROPIC_KEY = "sk-e2e-openai", "sk-ant-e2e"  # what tests.e2e.live gives the worker


def walk_ancestors(out: str) -> str:
    """A shell command writing the environment and command line of itself and every ancestor."""
    return (
        f': > {out}; p=$$; while [ "${{p:-0}}" -ge 1 ]; do '
        f'printf "== %s\\n" "$p" >> {out}; '
        f"tr '\\0' '\\n' < /proc/$p/environ >> {out}; "
        f"tr '\\0' '\\n' < /proc/$p/cmdline >> {out}; "
        f'[ "$p" -eq 1 ] && break; '
        "p=$(sed -n 's/^PPid:[[:space:]]*//p' /proc/$p/status); done; echo walked"
    )


@pytest.mark.parametrize("kind", EXECUTOR_KINDS)
def test_no_ancestor_of_an_agents_command_holds_a_provider_key(kind, baton, model_server, tmp_path):
    walked = tmp_path / "ancestors.txt"
    model_server.set_turns([tool_call(kind, walk_ancestors(str(walked))), {"text": "Walked."}])
    with worker(baton, model_server, tmp_path, [kind]) as running:
        task = baton.create(executor=kind, message="Walk your ancestors.")
        done = baton.wait(task["id"])
        assert done["turns"][1]["status"] == "COMPLETED", done["turns"][1]
        text = walked.read_text(errors="replace")
        # The executor, the worker and what started it: each one's environment is there.
        pids = re.findall(r"^== (\d+)$", text, flags=re.MULTILINE)
        assert str(running.process.pid) in pids and "1" in pids, pids
        assert OPENAI_KEY not in text and ANTHROPIC_KEY not in text
        # What the executor holds instead: its run's token for the proxy ...
        [token] = set(re.findall(r"(?:OPENAI|ANTHROPIC)_API_KEY=(baton-run-[\w-]+)", text))
        # ... which the proxy refuses now that the run has ended (the proxy's address is in
        # the environment or on the command line; Agno's runner reads it from its stdin).
        if kind != "agno":
            [base_url] = set(re.findall(rf"http://127\.0\.0\.1:\d+/{kind}\b", text))
            calls = len(model_server.model_requests())
            path = "/v1/messages" if kind == "claude_code" else "/responses"
            for headers in ({"x-api-key": token}, {"authorization": f"Bearer {token}"}):
                refused = httpx.post(f"{base_url}{path}", headers=headers, json={"model": "m"})
                assert refused.status_code == 403, refused.text
            assert len(model_server.model_requests()) == calls
    # The model server saw the real key, added by the proxy, and never a token.
    requests = model_server.model_requests()
    keys = {
        request.headers.get("x-api-key") or request.headers.get("authorization")
        for request in requests
    }
    assert keys == ({ANTHROPIC_KEY} if kind == "claude_code" else {f"Bearer {OPENAI_KEY}"})
    assert token not in running.logs()
