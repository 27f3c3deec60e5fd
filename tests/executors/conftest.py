"""Fixtures for the worker's tests: the stand-in model server on loopback."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from executors.standin import ModelServer


@pytest.fixture
def model_server() -> Iterator[ModelServer]:
    """A model server of this test's own on 127.0.0.1, recording every request."""
    with ModelServer() as server:
        yield server
