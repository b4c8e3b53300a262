"""Prefill/decode disaggregation in a cluster (instance ``role: prefill | decode``, docs/cluster.md).

Model: vLLM's P/D proxy with NIXL. The router picks a decode instance and a prefill instance when a
request arrives. The request goes to the decode instance, whose ``remote`` connector (NIXL's decode side,
:mod:`sim.connector.remote`) holds it back from the scheduler while it is prefilled remotely, exactly as
in a one-instance run; here the remote prefill is real: a *prefill leg* (the request's prompt with
``max_tokens: 1``, id ``<id>@prefill``, the client's arrival time) runs on the prefill instance's engine,
with its own prefix cache, batching and preemptions. When the leg finishes, its blocks stay allocated on
the prefill instance (NIXL's producer side: ``request_finished`` delays the free) and the decode instance's
scheduler gets the request: its connector answers ``R - local`` tokens (``R`` = the prompt less NIXL's
one-token backoff on a Mamba hybrid), pulls every group's KV (FA blocks, the Mamba state) over the
decode instance's link, and the prefill instance frees the leg's blocks once the pull is done (or at
once when the decode instance pulls nothing). TTFT is the decode instance's first token from the
client's arrival.

Invariants: every request has one ``requests`` row on its decode instance (``not_arrived`` if the run
stopped before its prefill finished) and, once its prefill leg started, one leg row on its prefill
instance; a leg's blocks are freed exactly once, after its decode instance pulled or declined them; the
decode instance's external hit is what was transferred.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

from sim.core.request import Request

#: Suffix of a prefill leg's request id.
PREFILL_LEG_SUFFIX = "@prefill"


def prefill_leg(request: Request) -> Request:
    """The request's prefill leg: its prompt with one output token, as the P/D proxy sends it to a prefill
    instance (``max_tokens: 1``, ``do_remote_decode``)."""
    return Request(
        request.request_id + PREFILL_LEG_SUFFIX,
        request.prompt,
        max_tokens=1,
        arrival_time=request.arrival_time,
        output_len=1,
        priority=request.priority,
        lora_name=request.lora_name,
        cache_salt=request.cache_salt,
        metadata=dict(request.metadata),
    )


def with_prefill_legs(requests: list[Request]) -> list[Request]:
    """``requests`` followed by their prefill legs: every request a P/D cluster's instances schedule (the ids
    ``verify`` and ``export kv-events`` number tokens over)."""
    return requests + [prefill_leg(r) for r in requests]


@dataclass
class _Leg:
    """One request between its routing and the end of its decode instance's pull."""

    prefill_instance: int
    decode_instance: int
    leg: Request
    finished: bool = False
    #: The decode connector's hand-over, once it asked for the remote prefill (``None``: not yet, or done).
    done: Callable[[], None] | None = None


@dataclass
class Disaggregation:
    """The cluster's P/D proxy and the prefill instances' producer side; see the module docstring.

    ``release(instance, request)`` hands a prefill leg to a prefill instance's loop; ``wake(instance)``
    wakes an instance that has something new (a request handed over, a leg to free).
    """

    release: Callable[[int, Request], None]
    wake: Callable[[int], None]
    #: Called when the last outstanding request has been pulled (the instances may end).
    on_idle: Callable[[], None]
    _legs: dict[str, _Leg] = field(default_factory=dict)
    #: Per prefill instance: legs whose blocks may be freed (reported as ``finished_sending``).
    _released: dict[int, set[str]] = field(default_factory=dict)
    #: Requests whose prefill leg was started.
    prefills: int = 0

    def busy(self) -> bool:
        """Some request's KV has not been pulled yet (its instances must stay open)."""
        return bool(self._legs)

    def start(self, request: Request, prefill_instance: int, decode_instance: int) -> None:
        """The router sent ``request`` to ``prefill_instance`` and ``decode_instance``: start its leg."""
        leg = prefill_leg(request)
        self._legs[request.request_id] = _Leg(prefill_instance, decode_instance, leg)
        self.prefills += 1
        self.release(prefill_instance, leg)

    # ------------------------------------------------------------------ decode side (RemoteConnector.prefill_side)
    def submit(self, request: Request, remote_tokens: int, done: Callable[[], None]) -> None:
        """The decode connector holds ``request`` until its prefill is done: now, or when the leg finishes."""
        state = self._legs[request.request_id]
        if state.finished:
            done()
        else:
            state.done = done

    def pulled(self, request: Request) -> None:
        """The decode instance pulled the request's KV, or will pull none: the prefill instance may free it."""
        state = self._legs.pop(request.request_id, None)
        if state is None:
            return
        self._released.setdefault(state.prefill_instance, set()).add(state.leg.request_id)
        self.wake(state.prefill_instance)
        if not self._legs:
            self.on_idle()

    # ------------------------------------------------------------------ prefill side (RemoteConnector.producer)
    def hold(self, leg: Request) -> bool:
        """A leg finished on its prefill instance: keep its blocks until the decode instance pulls them
        (True), and let the decode instance's scheduler see the request."""
        rid = leg.request_id.removesuffix(PREFILL_LEG_SUFFIX)
        state = self._legs.get(rid)
        if state is None or state.leg is not leg:
            return False
        state.finished = True
        if state.done is not None:
            done, state.done = state.done, None
            done()
            self.wake(state.decode_instance)
        return True

    def released(self, prefill_instance: int) -> set[str]:
        """Legs of ``prefill_instance`` whose blocks may be freed since the last call."""
        return self._released.pop(prefill_instance, set())


class DecodePort:
    """A decode instance's view of the proxy (its ``remote`` connector's ``prefill_side``)."""

    def __init__(self, pd: Disaggregation) -> None:
        self.pd = pd

    def submit(self, request: Request, remote_tokens: int, done: Callable[[], None]) -> None:
        self.pd.submit(request, remote_tokens, done)

    def pulled(self, request: Request) -> None:
        self.pd.pulled(request)


class PrefillPort:
    """A prefill instance's producer side (its ``remote`` connector's ``producer``)."""

    def __init__(self, pd: Disaggregation, instance: int) -> None:
        self.pd = pd
        self.instance = instance

    def hold(self, request: Request) -> bool:
        return self.pd.hold(request)

    def released(self) -> set[str]:
        return self.pd.released(self.instance)
