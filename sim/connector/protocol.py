"""A connector as the engine sees it: the scheduler's :class:`~sim.core.interfaces.SchedulerConnector` plus the
engine-side hooks (binding, routing arrivals, finished transfers, load errors, metrics, step columns).

:class:`sim.connector.base.KVConnector` implements every member with its
default; a plug-in connector that does not subclass it must still have them all.
"""

from __future__ import annotations

from typing import Any, Callable, Mapping, Protocol, runtime_checkable

from sim.connector.context import ConnectorContext
from sim.core.interfaces import SchedulerConnector
from sim.core.request import Request


class Connector(SchedulerConnector, Protocol):
    """What the engine calls on a connector, besides what the scheduler calls."""

    def bind(self, ctx: ConnectorContext) -> None:
        """Receive the run's context once, before step 0."""
        ...

    def route_arrival(self, request: Request, hand_over: Callable[[Request], None]) -> bool:
        """An arrived request: True keeps it from the scheduler until the connector calls ``hand_over(request)``."""
        ...

    def get_finished(self) -> tuple[set[str], set[str]]:
        """``(finished_recving, finished_sending)`` request ids since the last call."""
        ...

    def get_block_ids_with_load_errors(self) -> set[int]:
        """GPU block ids whose load failed since the last call."""
        ...

    def has_step_counted_loads(self) -> bool:
        """Loads are in flight whose completion is counted in engine steps (the engine keeps stepping)."""
        ...

    def metrics(self) -> dict[str, Any]:
        """Run-level metrics for ``summary.json``."""
        ...

    def step_columns(self) -> dict[str, Any]:
        """Per-step extension columns of the ``steps`` table."""
        ...


@runtime_checkable
class FaultInjector(Protocol):
    """A connector that takes ``connector_fault`` actions (the ``faulty`` wrapper)."""

    def check_fault(self, options: Mapping[str, Any]) -> None:
        """Raise ValueError naming the bad key (and the valid ones) if ``options`` cannot be injected."""
        ...

    def inject_fault(self, options: Mapping[str, Any]) -> None:
        """Apply ``options`` from now on."""
        ...
