"""Set up Django for a benchmark against a throwaway database.

SQLite: a fresh file in a temporary directory. PostgreSQL: `--postgres URL` names a server; the
benchmark creates (and drops afterwards) its own database there, so it never touches yours.
"""

from __future__ import annotations

import os
import sys
import tempfile
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

REPO_ROOT = Path(__file__).resolve().parent.parent


@contextmanager
def bench_database(postgres_url: str | None) -> Iterator[str]:
    """Configure and migrate a throwaway database; yield its vendor name."""
    sys.path.insert(0, str(REPO_ROOT))
    var_dir = tempfile.mkdtemp(prefix="baton-bench-")
    os.environ["BATON_VAR_DIR"] = var_dir
    os.environ["DJANGO_SETTINGS_MODULE"] = "settings"
    os.environ.setdefault("BATON_LOG_LEVEL", "WARNING")
    os.environ["DEBUG"] = "false"  # no per-query logging in the measured loop
    admin_url = None
    name = None
    if postgres_url:
        import psycopg

        name = f"baton_bench_{uuid.uuid4().hex[:8]}"
        admin_url = postgres_url
        with psycopg.connect(admin_url, autocommit=True) as admin:
            admin.execute(f'CREATE DATABASE "{name}"')
        parts = urlsplit(postgres_url)
        os.environ["DATABASE_URL"] = urlunsplit(parts._replace(path=f"/{name}"))
    else:
        os.environ.pop("DATABASE_URL", None)

    import django
    from django.core.management import call_command

    django.setup()
    call_command("migrate", verbosity=0)
    from django.db import connection

    try:
        yield connection.vendor
    finally:
        connection.close()
        if admin_url and name:
            import psycopg

            with psycopg.connect(admin_url, autocommit=True) as admin:
                admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
