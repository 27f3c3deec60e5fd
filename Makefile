# Baton: `make run` serves the demo on http://127.0.0.1:8000, `make serve` runs production,
# `make test` runs the whole suite.
PYTHON ?= python3.11
VENV := .venv
PY := $(VENV)/bin/python
PIP := $(VENV)/bin/pip
HOST ?= 127.0.0.1
PORT ?= 8000
# `make serve`: gunicorn processes, and the requests each serves at once (one per thread);
# each also gets a thread per event stream it may serve (BATON_MAX_EVENT_STREAMS,
# backend/gunicorn_conf.py).
BATON_WEB_WORKERS ?= 2
BATON_WEB_THREADS ?= 8

.PHONY: run serve test lint format bench install install-test clean

$(PY):
	@command -v $(PYTHON) >/dev/null 2>&1 || { echo "Baton needs $(PYTHON) on PATH (or run make PYTHON=/path/to/python3.11)"; exit 1; }
	$(PYTHON) -m venv $(VENV)
	$(PIP) install --quiet --upgrade pip

$(VENV)/.installed: pyproject.toml | $(PY)
	$(PIP) install --quiet -e ".[executors]"
	@touch $@

$(VENV)/.installed-test: pyproject.toml | $(PY)
	$(PIP) install --quiet -e ".[test,bench,executors]"
	@touch $(VENV)/.installed $@

install: $(VENV)/.installed
install-test: $(VENV)/.installed-test

# The API on $(HOST):$(PORT) and, beside it, a worker running Codex, Claude Code and Agno and
# the webhook sender. An executor whose provider key is not set (OPENAI_API_KEY,
# ANTHROPIC_API_KEY) answers with Baton's stand-in model. The worker waits for the server to
# answer, and says only what goes wrong (WORKER_LOG_LEVEL): the server's own lines show each
# turn. Once the server answers, the demo login is printed, last (kept in var/demo-login).
# Ctrl-C stops them all.
WORKER_LOG_LEVEL ?= WARNING
run: install
	@echo "Setting up the database and the demo data..."
	@$(PY) manage.py migrate --noinput --verbosity 0
	@$(PY) manage.py seed_demo --base-url http://$(HOST):$(PORT) --verbosity 0
	@BATON_URL=http://$(HOST):$(PORT) BATON_WORKER_TOKEN_FILE=var/demo-worker-token \
	  BATON_WORKSPACE_ROOT=var/workspaces BATON_WORKER_ID=demo-worker \
	  $(PY) -m executors --standin-model auto --log-level $(WORKER_LOG_LEVEL) & worker=$$!; \
	  $(PY) manage.py deliver_webhooks & sender=$$!; \
	  $(PY) manage.py seed_demo --base-url http://$(HOST):$(PORT) --login-when-up & login=$$!; \
	  trap 'kill -TERM $$worker $$sender $$login 2>/dev/null; wait $$worker $$sender $$login' \
	    EXIT INT TERM; \
	  $(PY) manage.py runserver $(HOST):$(PORT)

# Production: BATON_ENV=production (unless set otherwise), gunicorn with gthread workers
# (backend/gunicorn_conf.py), JSON log lines, static files from var/static. Needs SECRET_KEY and
# ALLOWED_HOSTS; behind a TLS proxy that sets X-Forwarded-Proto (README, "Production").
serve: install
	@test -n "$$SECRET_KEY" || { echo "make serve needs SECRET_KEY (python -c 'import secrets; print(secrets.token_urlsafe(50))')"; exit 1; }
	BATON_ENV=$${BATON_ENV:-production} $(PY) manage.py migrate --noinput
	BATON_ENV=$${BATON_ENV:-production} $(PY) manage.py collectstatic --noinput --verbosity 0
	BATON_ENV=$${BATON_ENV:-production} BATON_WEB_THREADS=$(BATON_WEB_THREADS) \
	  exec $(PY) -m gunicorn backend.wsgi --config python:backend.gunicorn_conf \
	  --bind $(HOST):$(PORT) --workers $(BATON_WEB_WORKERS)

# `make test`: pytest-xdist processes, each with its own test database (0: one process, no
# xdist); it ends with the 15 slowest tests. `--dist load` hands each process its tests in
# collection order, so pytest-django's order holds in each (tests in a transaction first, then
# the transactional ones that flush the rows the migrations seed); by-file or by-class
# grouping would break it.
PYTEST_WORKERS ?= 2
test: install-test
	@bash .ci/install-browser || echo "note: chromium/chromedriver missing and not installable here; the admin browser test will be skipped"
	$(PY) -m pytest $(if $(filter 0,$(PYTEST_WORKERS)),-p no:xdist,-n $(PYTEST_WORKERS) --dist load) \
	  --durations=15 $(PYTEST_ARGS)

# `make bench`: the benchmark scenarios (bench/README.md), each printing its figures against
# their baselines and targets and writing bench/results/<scenario>.json.
# `make bench SCENARIOS="prompt_core dispatch"` runs some; `QUICK=1` shrinks every size for a
# smoke run. The scenarios with a database use PostgreSQL at BENCH_POSTGRES (they create and
# drop a database of their own there).
SCENARIOS ?=
QUICK ?=
BENCH_POSTGRES ?= postgres://postgres@127.0.0.1:5432/postgres
bench: install-test
	$(PY) bench/run.py $(SCENARIOS) $(if $(QUICK),--quick) --postgres $(BENCH_POSTGRES)

# The static checks CI runs (and .pre-commit-config.yaml runs before a commit): lint and format,
# the import layers, types, and migrations that match the models.
lint: install-test
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	$(VENV)/bin/lint-imports
	$(VENV)/bin/mypy
	$(PY) manage.py makemigrations --check --dry-run

format: install-test
	$(VENV)/bin/ruff format .
	$(VENV)/bin/ruff check --fix .

clean:
	rm -rf $(VENV) var .pytest_cache .ruff_cache .mypy_cache .import_linter_cache .hypothesis
