"""``python -m tests.bench [history|scale] ...``: runs the synthetic benchmark (run.py), or the
real-history (history.py) or large-workspace (scale.py) scenario; ``--help`` on each."""

import sys

from tests.bench import history, run, scale

SCENARIOS = {"history": history.main, "scale": scale.main}

arguments = sys.argv[1:]
if arguments and arguments[0] in SCENARIOS:
    raise SystemExit(SCENARIOS[arguments[0]](arguments[1:]))
raise SystemExit(run.main(arguments))
