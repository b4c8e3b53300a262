"""The cyclic garbage collector while the process starts up (docs/speed.md).

Importing the command line, a command's own modules and typer's pydantic adapters, and building a scenario's
validators, make tens of thousands of objects that live as long as the process and next to no cyclic garbage.
With the collector on, it walks that growing heap again and again while it is built (about 90 collections for
``hybridsim validate``, 0.03-0.04 s of CPU on the 2-core machine). :func:`long_lived` turns it off for such a
block and freezes what the block built, so that later collections skip it too. A run's simulation has its own
pause (:func:`sim.engine.collector.collector_paused`).

At the end, :func:`end_quickly` / :func:`quick_exit`: a command that has written and closed everything lets the
process end without the interpreter's teardown.
"""

from __future__ import annotations

import atexit
import gc
import os
import sys
import threading
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


#: Whether the command that runs asked to end the process without the interpreter's teardown (:func:`end_quickly`).
_END_QUICKLY: list[bool] = [False]


def end_quickly() -> None:
    """Ask :func:`sim.entry.main` to end the process, once the command returns, without tearing the interpreter
    down (:func:`quick_exit`). For commands whose files are all written and closed when they return (``run``,
    ``validate``, the help page): the teardown frees, one object at a time, the modules and whatever the command
    left alive, which the operating system would drop at once (about 0.012 s of a 1000-request run)."""
    _END_QUICKLY[0] = True


def ends_quickly() -> bool:
    """Whether the command asked for :func:`end_quickly`."""
    return _END_QUICKLY[0]


def quick_exit(code: object) -> None:
    """End the process with the status a ``SystemExit(code)`` gives (``None`` is 0, an integer is itself), after
    the exit handlers (:mod:`atexit`) and with standard output and error flushed, as the interpreter would, but
    without its teardown (``os._exit``). Returns, leaving the exit to the interpreter, when that could differ:
    another thread still runs (the interpreter would wait for it), the code is a message (it prints it), or
    standard output or error cannot be flushed (it reports that and exits 120)."""
    if threading.active_count() > 1 or not (code is None or isinstance(code, int)):
        return
    try:
        sys.stdout.flush()
        sys.stderr.flush()
    except (OSError, ValueError):
        return
    atexit._run_exitfuncs()
    try:
        sys.stdout.flush()
        sys.stderr.flush()
    except (OSError, ValueError):
        os._exit(120)
    os._exit(0 if code is None else int(code))
