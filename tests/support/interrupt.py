"""A Ctrl-C delivered at a chosen simulated time, from inside the SimPy run (as a signal turned into
``KeyboardInterrupt`` reaches it)."""

from __future__ import annotations

import simpy


def interrupt_at(env: simpy.Environment, at: float) -> None:
    """Raise ``KeyboardInterrupt`` from an event processed at simulated time ``at``."""

    def interrupt(_event: simpy.Event) -> None:
        raise KeyboardInterrupt("interrupted (test)")

    event = simpy.Event(env)
    event._ok, event._value = True, None
    event.callbacks.append(interrupt)
    env.schedule(event, delay=at)
