"""The cyclic garbage collector while the process starts up (docs/speed.md).

Importing the command line, a command's own modules and typer's pydantic adapters, and building a scenario's
validators, make tens of thousands of objects that live as long as the process and next to no cyclic garbage.
With the collector on, it walks that growing heap again and again while it is built (about 90 collections for
``hybridsim validate``, 0.03-0.04 s of CPU on the 2-core machine). :func:`long_lived` turns it off for such a
block and freezes what the block built, so that later collections skip it too. A run's simulation has its own
pause (:func:`sim.engine.collector.collector_paused`).
"""

from __future__ import annotations

import gc
from contextlib import contextmanager
from typing import Iterator


@contextmanager
def long_lived() -> Iterator[None]:
    """The cyclic collector off inside the block, and what the block built frozen after it (left out of every
    later collection); the collector's state is then restored. Frozen objects are still freed by reference
    counting; only cyclic garbage made in the block stays until the process exits."""
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        gc.freeze()
        if was_enabled:
            gc.enable()
