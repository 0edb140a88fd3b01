"""Owner-write windows: a read-only directory the server owns gets its owner's write bit for each
change a rollback makes among its entries (root ignores the bit; a server that is not root would
fail there for good), and its mode back right after. A window is journaled before it first opens
in a run and journaled closed when the run ends (``WindowJournal``), so whoever finishes a
rollback killed with a window open sets the mode back (``Workspace.close_window``), and only on a
directory with that identity (``Window.dev``, ``Window.ino``)."""

from __future__ import annotations

import stat
from typing import NamedTuple, Protocol


class Window(NamedTuple):
    """A directory made owner-writable: the mode to put back and the directory's identity."""

    path: str
    mode: int
    dev: int
    ino: int

    @property
    def writable(self) -> int:
        return self.mode | stat.S_IWUSR


class WindowJournal(Protocol):
    def opening(self, window: Window) -> None:
        """Records ``window`` durably before it opens; what it raises stops the change."""

    def closed(self, window: Window) -> None:
        """``window`` is closed (its mode set back, or taken over by a mode step). Never raises."""
