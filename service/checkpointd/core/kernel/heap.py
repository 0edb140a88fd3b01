"""Python's cyclic garbage collector, kept off the server's long-lived objects.

CPython runs a full collection, which visits every tracked object, each time the objects
that survived earlier collections have grown by a quarter. A first capture of 100k files
adds some 300k long-lived objects (tree entries, store locations, stat index entries) to the
100k that importing the server leaves, so six full collections ran inside it: 0.6-0.7 s of
a 7 s checkpoint, spent finding no garbage. Two measures:

- ``freeze_startup_heap``: what exists once the server is built (modules, classes, the
  store's index of its objects) lives as long as the process; it is moved out of the
  collector's sight (``gc.freeze``).
- ``pause``/``resume``: while a workspace's first capture builds its objects, automatic
  collection is off (process-wide; nested and concurrent pauses are counted). When the last
  pause ends after many allocations, one full collection runs (so no cyclic garbage is kept)
  and the survivors are frozen too, so no later small request pays for visiting them.

Frozen objects are still freed by reference counting when they are dropped. A cycle among
frozen objects that becomes garbage later is never collected: what gets frozen here (tree
entries, store locations, stat index entries) forms none, and the collection before each
freeze leaves no garbage cycle to be frozen.
"""

from __future__ import annotations

import gc
import threading

#: Net tracked allocations during a pause beyond which its end collects and freezes. Below it,
#: the objects are left to the ordinary young-generation collections.
FREEZE_AFTER_ALLOCATIONS = 50_000

_lock = threading.Lock()
_pauses = 0
_resume_enabled = True


def freeze_startup_heap() -> None:
    """Collects once, then exempts every object that exists now from later collections."""
    gc.collect()
    gc.freeze()


def pause() -> None:
    """Turns automatic collection off until the matching ``resume``."""
    global _pauses, _resume_enabled
    with _lock:
        if _pauses == 0:
            _resume_enabled = gc.isenabled()
            gc.disable()
        _pauses += 1


def resume() -> None:
    """Ends one ``pause``; the last one restores collection as it was before the first."""
    global _pauses
    with _lock:
        if _pauses == 0:
            raise RuntimeError("resume() without a matching pause()")
        _pauses -= 1
        if _pauses:
            return
        if gc.get_count()[0] >= FREEZE_AFTER_ALLOCATIONS:
            gc.collect()
            gc.freeze()
        if _resume_enabled:
            gc.enable()
