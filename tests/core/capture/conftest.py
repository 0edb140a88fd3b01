"""The capture tests' shared fixture: real watched and full-scan capturers over one store and one
watcher (``tests/engine/conftest.open_engines``), as ``engines``."""

from tests.engine.conftest import engines  # noqa: F401  (the fixture itself, for the tests here)
