"""`baton-executor` / `python -m executors`: start a worker from flags and environment.

At start the worker takes hold of its workspace root and the worker id kept there
(`executors.identity`: a restarted worker is known to the backend by the same name, so it
resumes its native sessions; a second worker on the same root is refused). It then finds every
executor it was asked to serve, once (a missing one stops it with a message saying how to
install it), works out each executor's model endpoint — the provider named by the ecosystem's
own variables, or Baton's stand-in model when asked to — waits for the backend to answer its
health check (quietly at first: the server may be starting beside it), and then claims turns
until it is stopped. Exit codes: 0 stopped or idle (--once), 2 configuration or setup problem
(a workspace root another worker holds included).
"""

from __future__ import annotations

import json
import logging
import os
import sys
from collections.abc import Sequence

from executors.adapters import adapter_for
from executors.adapters.base import ExecutorAdapter, ExecutorUnavailable, ModelEndpoint
from executors.client import BackendClient
from executors.config import ConfigurationError, StandinMode, WorkerSettings, load_settings
from executors.credentials import (
    CredentialProxy,
    ProxiedEndpoint,
    hand_off_keys,
    take_handed_keys,
    upstream_for_provider,
)
from executors.identity import WorkerIdentity, claim_workspace_root
from executors.kinds import KINDS, PROVIDERS
from executors.logs import configure_logging
from executors.standin import ModelServer
from executors.worker import Worker

logger = logging.getLogger("baton.worker")

STANDIN_API_KEY = "baton-standin-no-key"  # the stand-in accepts any key; executors want one


def model_endpoints(
    settings: WorkerSettings, *, standin_url: str | None
) -> dict[str, ModelEndpoint]:
    """Each served kind's endpoint. Raises ConfigurationError for a kind with no provider."""
    endpoints = {}
    for kind in settings.kinds:
        provider = KINDS[kind].provider
        access = settings.provider(provider)
        base_url, api_key = access.base_url, access.api_key
        if uses_standin(settings, kind):
            assert standin_url is not None
            base_url = f"{standin_url}{provider.standin_path}"
            api_key = STANDIN_API_KEY
        elif not access.configured:
            raise ConfigurationError(
                f"{kind} has no model provider: set {provider.api_key_variable} (or "
                f"{provider.base_url_variable}), or run with --standin-model auto to answer "
                "with Baton's stand-in model"
            )
        endpoints[kind] = ModelEndpoint(
            base_url=base_url, api_key=api_key, max_retries=settings.model_retries
        )
    return endpoints


def uses_standin(settings: WorkerSettings, kind: str) -> bool:
    if settings.standin is StandinMode.ALWAYS:
        return True
    if settings.standin is StandinMode.NEVER:
        return False
    return not settings.provider(KINDS[kind].provider).configured


def endpoint_source(settings: WorkerSettings, kind: str) -> str:
    """Where `kind`'s model calls go, as the log says it: `standin`, `configured` (the
    provider's base URL variable) or `default` (the provider's own API)."""
    if uses_standin(settings, kind):
        return "standin"
    return "configured" if settings.provider(KINDS[kind].provider).base_url else "default"


def locate_adapters(kinds: Sequence[str]) -> dict[str, ExecutorAdapter]:
    """Find every executor once, at start; ExecutorUnavailable names what is missing."""
    adapters = {}
    problems = []
    for kind in kinds:
        adapter = adapter_for(kind)
        try:
            adapter.locate()
        except ExecutorUnavailable as error:
            problems.append(f"{kind}: {error}")
            continue
        adapters[kind] = adapter
    if problems:
        raise ExecutorUnavailable("; ".join(problems))
    return adapters


def main(argv: Sequence[str] | None = None) -> int:
    """The worker program; `argv` None: this process's own arguments. Started with provider
    keys in its environment, the program re-executes itself without them first
    (`executors.credentials`: no process an agent can read holds a key)."""
    if argv is None:
        hand_off_keys(sys.orig_argv, os.environ)
    keys = take_handed_keys(os.environ)
    for provider in PROVIDERS:  # started by a caller (argv given): gone from here on at least
        if (key := os.environ.pop(provider.api_key_variable, None)) is not None:
            keys.setdefault(provider.api_key_variable, key)
    try:
        settings = load_settings(argv, {**os.environ, **keys})
    except ConfigurationError as error:
        print(f"baton-executor: {error}", file=sys.stderr)
        return 2
    configure_logging(settings.log_level)
    try:
        with claim_workspace_root(
            root=settings.workspace_root, explicit_worker_id=settings.worker_id
        ) as identity:
            return _serve(settings, identity)
    except ConfigurationError as error:
        print(f"baton-executor: {error}", file=sys.stderr)
        return 2
    except ExecutorUnavailable as error:
        print(f"baton-executor: cannot serve the requested executors: {error}", file=sys.stderr)
        return 2


def _serve(settings: WorkerSettings, identity: WorkerIdentity) -> int:
    """Run the worker while this process holds its workspace root."""
    # An explicit id that replaced the kept one: the sessions recorded under the old id start
    # afresh (the backend offers their resume to that id only).
    logger.log(
        logging.WARNING if identity.replaced else logging.INFO,
        json.dumps(
            {
                "event": "worker_identity",
                "worker_id": identity.worker_id,
                "source": identity.source.value,
                "replaced": identity.replaced,
            }
        ),
    )
    adapters = locate_adapters(settings.kinds)
    standin = None
    if any(uses_standin(settings, kind) for kind in settings.kinds):
        standin = ModelServer(keep_requests=False).start()
    proxy = None
    try:
        direct = model_endpoints(settings, standin_url=standin.url if standin else None)
        proxy = CredentialProxy(
            {
                kind: upstream_for_provider(
                    KINDS[kind].provider, base_url=endpoint.base_url, api_key=endpoint.api_key
                )
                for kind, endpoint in direct.items()
            }
        ).start()
        endpoints: dict[str, ModelEndpoint] = {
            kind: ProxiedEndpoint(max_retries=endpoint.max_retries, proxy=proxy, route=kind)
            for kind, endpoint in direct.items()
        }
        for kind in settings.kinds:
            logger.info(
                json.dumps(
                    {
                        "event": "executor_ready",
                        "kind": kind,
                        # Which endpoint, never its URL: one may carry credentials.
                        "model_endpoint": endpoint_source(settings, kind),
                    }
                )
            )
        client = BackendClient(
            base_url=settings.backend_url, token=settings.token, worker_id=identity.worker_id
        )
        worker = Worker(settings=settings, client=client, adapters=adapters, endpoints=endpoints)
        worker.install_signal_handlers()
        if not worker.wait_for_backend():
            return 0  # stopped before the backend answered
        return worker.run()
    finally:
        if proxy is not None:
            proxy.stop()
        if standin is not None:
            standin.stop()
