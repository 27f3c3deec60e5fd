"""End-to-end tests: real processes (a browser, executors) against a live Baton server."""
