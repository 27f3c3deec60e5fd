"""Registers the `e2e` marker, so `pytest -m "not e2e"` can leave the slow end-to-end tests out."""

from __future__ import annotations

import pytest


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers", "e2e: end to end through real processes (a headless browser, executors)"
    )
