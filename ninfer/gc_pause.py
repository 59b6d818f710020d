"""The cyclic garbage collector paused while a large request is decoded, used and freed on a worker thread.

A full collection walks every object the collector tracks, holding the GIL throughout: no other thread of the
process runs meanwhile (the actor's event loops, the engine's step loop; the API's event loop). Building millions of
containers (a request of a million messages whose content is a list of parts) triggers full collections again and
again as the heap grows. Measured (2-core CPU host): decoding two million such messages ran ten full collections,
the last 0.55 s, 2.5 s in all; with the collector paused, none. What the block builds is freed before the
collector comes back (reference counting frees it: a request holds no cycles), so it is never walked at all.
"""

from __future__ import annotations

import gc
import threading
from collections.abc import Iterator
from contextlib import contextmanager

__all__ = ["gc_paused"]

_lock = threading.Lock()
_pauses = 0  # gc_paused blocks running now (under _lock): the collector is off while any runs


@contextmanager
def gc_paused() -> Iterator[None]:
    """The collector off for the block (blocks on several threads nest: it comes back when the last one ends)."""
    global _pauses
    with _lock:
        if _pauses == 0:
            gc.disable()
        _pauses += 1
    try:
        yield
    finally:
        with _lock:
            _pauses -= 1
            if _pauses == 0:
                gc.enable()
