"""SIGINT and SIGTERM as one clean interrupt, and critical sections that finish before it lands.

* :func:`interrupts_raise` (a context manager for the CLI and ``sim.run``): while active, SIGTERM, like
  SIGINT, raises :class:`Interrupted` (a ``KeyboardInterrupt``) in the main thread, with the signal's name
  in its message. The run loop stops, records what was computed, and writes a bundle marked partial.
* :func:`deferred`: a section that finishes before a signal lands. A first SIGINT/SIGTERM is held (and
  ``notice`` printed) and delivered when the outermost deferred section ends; a second one raises
  :class:`Interrupted` at once. ``sim.run_scenario`` holds signals from the end of the simulation until the
  bundle is swapped in (so a signal while a finished run writes its tables still leaves the whole bundle,
  then the process stops); the bundle writer holds them while it finishes a stage (manifest, fsync, swap).
* :func:`interruptible`: inside a deferred section, a part that a signal may stop at once (building and
  simulating the run).

Sections nest: one handler serves them all, so there is no moment without a handler between them. Outside
the main thread all of this is a no-op (Python only delivers signals there).

`pause_point` is a hook for the kill-window tests: when the environment variable
``HYBRIDSIM_TEST_PAUSE`` is ``<point>:<seconds>``, the process prints ``paused at <point>`` to stderr and
sleeps at that point (``write`` between bundle files, ``manifest`` before the manifest, ``swap`` before the
swap, ``sort`` before the old folder is sorted, ``run`` at the first engine step through :func:`pause_hook`). It
does nothing when the variable is unset.
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


#: How many deferred sections are open (0: signals raise at once), the held signal, the notice to print,
#: how many signals the handler has taken and the latest of them.
_state: dict[str, Any] = {"depth": 0, "pending": [], "notice": None, "taken": 0, "last": None}


def signals_taken() -> int:
    """How many SIGINT/SIGTERM the handler has taken in this process so far."""
    return int(_state["taken"])


def reraise_since(count: int) -> None:
    """Raise :class:`Interrupted` for the latest signal if one was taken since :func:`signals_taken` was
    ``count``: a caller that runs commands in-process (each turning a signal into its exit code, 130) stops
    too, instead of going on with the next command."""
    if _state["taken"] > count:
        raise Interrupted(_state["last"])


def _handle(signum: int, frame: FrameType | None) -> None:
    _state["taken"] += 1
    _state["last"] = signum
    if _state["depth"] == 0:
        raise Interrupted(signum)
    pending: list[int] = _state["pending"]
    if pending:
        raise Interrupted(signum)  # a second signal: stop now
    pending.append(signum)
    notice = _state["notice"]
    if notice:
        os.write(2, f"{signal.Signals(signum).name}: {notice}\n".encode("utf-8", "replace"))


@contextmanager
def _handler_installed() -> Iterator[None]:
    """:func:`_handle` for SIGINT and SIGTERM inside the block (nested use keeps it installed)."""
    previous = {s: signal.getsignal(s) for s in _SIGNALS}
    for s in _SIGNALS:
        if previous[s] is not _handle:
            signal.signal(s, _handle)
    try:
        yield
    finally:
        for s, handler in previous.items():
            if handler is not _handle:
                signal.signal(s, handler)


@contextmanager
def interrupts_raise() -> Iterator[None]:
    """SIGINT and SIGTERM raise :class:`Interrupted` inside the block; previous handlers come back after."""
    if not _main_thread():
        yield
        return
    with _handler_installed():
        yield


@contextmanager
def deferred(notice: str | None = None) -> Iterator[None]:
    """Hold a first SIGINT/SIGTERM until the outermost deferred block ends (printing ``notice`` when one
    arrives); a second one raises :class:`Interrupted` at once. The held signal is then re-raised, to
    whatever handler was there before (:func:`interrupts_raise`: :class:`Interrupted`)."""
    if not _main_thread():
        yield
        return
    outer_notice = _state["notice"]
    if notice is not None:
        _state["notice"] = notice
    held: list[int] = []
    with _handler_installed():
        _state["depth"] += 1
        try:
            yield
        finally:
            _state["depth"] -= 1
            _state["notice"] = outer_notice
            if _state["depth"] == 0:
                held, _state["pending"] = _state["pending"], []
    if held:
        if signal.getsignal(held[0]) is _handle:
            raise Interrupted(held[0])  # an enclosing interrupts_raise
        signal.raise_signal(held[0])  # delivered to the restored handler


@contextmanager
def interruptible() -> Iterator[None]:
    """Inside :func:`deferred`, let a signal raise :class:`Interrupted` at once (a held one is raised on entry)."""
    if not _main_thread() or _state["depth"] == 0:
        yield
        return
    depth, held = _state["depth"], _state["pending"]
    _state["depth"], _state["pending"] = 0, []
    try:
        if held:
            raise Interrupted(held[0])
        yield
    finally:
        _state["depth"] = depth


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
