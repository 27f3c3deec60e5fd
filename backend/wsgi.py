"""WSGI entry point for serving Baton (e.g. `gunicorn backend.wsgi`)."""

import os

from django.core.wsgi import get_wsgi_application

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "settings")

application = get_wsgi_application()
