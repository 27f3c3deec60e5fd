"""Django's PostgreSQL backend with a health check that costs no round trip on a quiet
connection (see `base.DatabaseWrapper.is_usable`)."""
