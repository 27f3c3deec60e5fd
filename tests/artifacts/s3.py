"""A real S3 API for tests: moto's server on 127.0.0.1, started inside the test run, and the
artifact storage pointed at a fresh bucket on it through Baton's own S3 configuration.

The fixtures are offered to every artifact test by `tests/artifacts/conftest.py`; moto and
boto3 are imported only by a test that asks for them. Nothing is started outside pytest and
nothing leaves 127.0.0.1: credentials are dummies set in the environment (where boto3 looks
for them), and instance metadata lookups are off.
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import pytest

from settings.environment import load_environment

REGION = "us-east-1"


@dataclass(frozen=True)
class Bucket:
    """A bucket on the local S3 server, and a client of its own for what a test does behind
    Baton's back (damage an object, list what is there)."""

    name: str
    endpoint_url: str
    client: Any

    def object_keys(self) -> list[str]:
        listed = self.client.list_objects_v2(Bucket=self.name)
        return sorted(item["Key"] for item in listed.get("Contents", []))

    def get(self, key: str) -> bytes:
        return bytes(self.client.get_object(Bucket=self.name, Key=key)["Body"].read())

    def put(self, key: str, data: bytes) -> None:
        self.client.put_object(Bucket=self.name, Key=key, Body=data)

    def set_modified(self, key: str, when: datetime) -> None:
        """Backdate an object's LastModified, as `os.utime` does for a file: the server runs
        in this process, and S3 offers no call for it."""
        from moto.core import DEFAULT_ACCOUNT_ID
        from moto.s3.models import s3_backends

        backend = s3_backends[DEFAULT_ACCOUNT_ID]["aws"]
        # moto keeps naive UTC times.
        stored = backend.buckets[self.name].keys[key]
        stored.last_modified = when.astimezone(UTC).replace(tzinfo=None)


@pytest.fixture(scope="session")
def s3_endpoint() -> Iterator[str]:
    from moto.server import ThreadedMotoServer

    # The server's access log (one line per request) would bury a failing test's own output.
    access_log = logging.getLogger("werkzeug")
    level = access_log.level
    access_log.setLevel(logging.WARNING)
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    try:
        yield f"http://{host}:{port}"
    finally:
        server.stop()
        access_log.setLevel(level)


@pytest.fixture
def s3_bucket(s3_endpoint: str, settings, monkeypatch: pytest.MonkeyPatch) -> Bucket:
    """Artifacts stored in a new bucket on the local S3 server, configured as an operator
    would: BATON_ARTIFACT_STORAGE=s3, its bucket and endpoint, AWS credentials in the
    environment."""
    for variable, value in {
        "AWS_ACCESS_KEY_ID": "testing",
        "AWS_SECRET_ACCESS_KEY": "testing",
        "AWS_SESSION_TOKEN": "testing",
        "AWS_EC2_METADATA_DISABLED": "true",
        "AWS_CONFIG_FILE": "/dev/null",
        "AWS_SHARED_CREDENTIALS_FILE": "/dev/null",
    }.items():
        monkeypatch.setenv(variable, value)
    monkeypatch.delenv("AWS_PROFILE", raising=False)
    import boto3

    name = f"baton-{uuid.uuid4().hex[:12]}"
    client = boto3.client("s3", endpoint_url=s3_endpoint, region_name=REGION)
    client.create_bucket(Bucket=name)
    environment = load_environment(
        {
            "BATON_ARTIFACT_STORAGE": "s3",
            "BATON_S3_BUCKET": name,
            "BATON_S3_ENDPOINT_URL": s3_endpoint,
            "BATON_S3_REGION": REGION,
        }
    )
    # A new STORAGES setting drops the storage instances Django has built (its
    # setting_changed receiver), so `artifact_storage()` builds the S3 one from here on.
    settings.STORAGES = {**settings.STORAGES, "artifacts": environment.artifact_storage()}
    return Bucket(name=name, endpoint_url=s3_endpoint, client=client)
