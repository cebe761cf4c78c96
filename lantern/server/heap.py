"""How a long-running server's heap is collected: CPython's defaults suit short scripts.

Measured on ``lantern serve`` (bench/service.py, 32 code-first runs at a time): with the
defaults, the cyclic collector took about 6% of the server's CPU, and each full collection
walked the 130,000 objects that imports, the app and its routes leave behind: tens of
milliseconds with every request waiting. Finished spans waiting for their export, receipts
for their batch and runs for their answer live long enough to be promoted, so full
collections keep coming under load (three in a 20-second bench section).
"""

from __future__ import annotations

import gc

# Young objects are collected after this many more allocations than deallocations (CPython's
# default is 700): a run's request, drive and steps allocate thousands, nearly all freed by
# reference counting before a collection would find them.
YOUNG_THRESHOLD = 10_000


def settle() -> None:
    """Before the server starts serving, with its app built: collect what loading left, move
    the rest to the permanent generation (``gc.freeze``) so no later collection walks it,
    and collect young objects less often. Only for a process that is the server (``lantern
    serve``): objects frozen here are never collected."""
    gc.collect()
    gc.freeze()
    _, middle, old = gc.get_threshold()
    gc.set_threshold(YOUNG_THRESHOLD, middle, old)
