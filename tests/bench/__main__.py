"""``python -m tests.bench``: runs the benchmark (see tests/bench/run.py for the flags)."""

from tests.bench.run import main

raise SystemExit(main())
