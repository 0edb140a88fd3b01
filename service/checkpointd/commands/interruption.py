"""Ctrl-C in the command line: the exit status, and what a command says it left behind.

Standard library only: cli.main needs these names before it has loaded anything else."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

#: Exit status after Ctrl-C, as a shell reports a command killed by SIGINT (128 + 2).
INTERRUPTED_EXIT = 130
#: What Ctrl-C means where no command said otherwise: nothing had been asked to change yet.
NOTHING_CHANGED = "aborted, nothing changed"


class Interrupted(Exception):
    """Ctrl-C while a change was on its way to the server; the message says what may have happened."""


@contextlib.contextmanager
def on_interrupt(message: str) -> Iterator[None]:
    """Within this block, Ctrl-C ends the command with ``message`` instead of 'nothing changed'."""
    try:
        yield
    except KeyboardInterrupt:
        raise Interrupted(message) from None
