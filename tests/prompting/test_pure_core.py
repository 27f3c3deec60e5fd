"""The prompt builder core stays pure: importing it loads nothing from Django (principle 4)."""

from __future__ import annotations

import importlib
import pkgutil
import subprocess
import sys
from pathlib import Path

import backend.prompting

ROOT = Path(__file__).resolve().parents[2]


def test_importing_the_core_loads_no_django() -> None:
    probe = (
        "import sys, backend.prompting; "
        "print(sorted(m for m in sys.modules if m == 'django' or m.startswith('django.')))"
    )
    result = subprocess.run(
        [sys.executable, "-c", probe], cwd=ROOT, capture_output=True, text=True, check=True
    )
    assert result.stdout.strip() == "[]"


def test_every_module_says_why_it_exists_and_is_listed_by_the_package() -> None:
    package_doc = backend.prompting.__doc__ or ""
    for info in pkgutil.iter_modules(backend.prompting.__path__):
        module = importlib.import_module(f"backend.prompting.{info.name}")
        assert module.__doc__, f"{info.name} has no docstring"
        assert f"* ``{info.name}`` — " in package_doc, f"{info.name} is not listed"
