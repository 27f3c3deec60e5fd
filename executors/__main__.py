"""`python -m executors`: run Baton's executor worker (see `executors.cli`)."""

from executors.cli import main

raise SystemExit(main())
