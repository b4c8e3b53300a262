"""SIGINT and SIGTERM as one clean interrupt, and critical sections that finish before it lands.

* :func:`interrupts_raise` (a context manager for the CLI and ``sim.run``): while active, SIGTERM, like
  SIGINT, raises :class:`Interrupted` (a ``KeyboardInterrupt``) in the main thread, with the signal's name
  in its message. The run loop stops, records what was computed, and writes a bundle marked partial.
* :func:`deferred`: while a bundle is being finished (manifest, fsync, rename), a first SIGINT/SIGTERM is
  held and delivered when the section ends (so the bundle lands whole, then the process stops); a second
  one aborts the section at once (the writer then removes its stage and the old bundle stays).

Outside the main thread both are no-ops (Python only delivers signals there).

`pause_point` is a hook for the kill-window tests: when the environment variable
``HYBRIDSIM_TEST_PAUSE`` is ``<point>:<seconds>``, the process prints ``paused at <point>`` to stderr and
sleeps at that point (``write`` between bundle files, ``manifest`` before the manifest, ``swap`` before the
rename, ``run`` at the first engine step through :func:`pause_hook`). It does nothing when the variable is
unset.
"""

from __future__ import annotations

import os
import signal
import sys
import threading
import time
from contextlib import contextmanager
from types import FrameType
from typing import Any, Callable, Iterator

_SIGNALS = (signal.SIGINT, signal.SIGTERM)


class Interrupted(KeyboardInterrupt):
    """The run was interrupted by a signal; ``str()`` names it (e.g. ``interrupted (SIGTERM)``)."""

    def __init__(self, signum: int):
        super().__init__(f"interrupted ({signal.Signals(signum).name})")
        self.signum = signum


def _main_thread() -> bool:
    return threading.current_thread() is threading.main_thread()


def _raise(signum: int, frame: FrameType | None) -> None:
    raise Interrupted(signum)


@contextmanager
def interrupts_raise() -> Iterator[None]:
    """SIGINT and SIGTERM raise :class:`Interrupted` inside the block; previous handlers come back after."""
    if not _main_thread():
        yield
        return
    previous = {s: signal.signal(s, _raise) for s in _SIGNALS}
    try:
        yield
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)


@contextmanager
def deferred() -> Iterator[None]:
    """Hold a first SIGINT/SIGTERM until the block ends; a second one raises :class:`Interrupted` at once."""
    if not _main_thread():
        yield
        return
    pending: list[int] = []

    def hold(signum: int, frame: FrameType | None) -> None:
        if pending:
            raise Interrupted(signum)
        pending.append(signum)

    previous: dict[int, Any] = {s: signal.signal(s, hold) for s in _SIGNALS}
    try:
        yield
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)
    if pending:
        signal.raise_signal(pending[0])  # delivered to the restored handler


def pause_point(point: str) -> None:
    """Sleep at ``point`` when ``HYBRIDSIM_TEST_PAUSE=<point>:<seconds>`` (kill-window tests only)."""
    spec = os.environ.get("HYBRIDSIM_TEST_PAUSE")
    if not spec:
        return
    where, _, seconds = spec.partition(":")
    if where != point:
        return
    print(f"paused at {point}", file=sys.stderr, flush=True)
    deadline = time.monotonic() + float(seconds or "5")
    while time.monotonic() < deadline:  # sleep in slices so that a held signal cannot be lost
        time.sleep(0.05)


def pause_hook(point: str) -> Callable[..., None] | None:
    """A callback that calls :func:`pause_point` once (for the engine's progress hook), or None when unused."""
    if not os.environ.get("HYBRIDSIM_TEST_PAUSE", "").startswith(point + ":"):
        return None
    done: list[bool] = []

    def hook(*_: Any) -> None:
        if not done:
            done.append(True)
            pause_point(point)

    return hook
