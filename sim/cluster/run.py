"""Stages 1 and 2 of a cluster run: :func:`build_cluster_run` wires the instances, :meth:`ClusterRun.execute`
simulates them on one clock (docs/cluster.md).

Each instance is wired exactly as a one-instance run (:func:`sim.engine.run.build_run`: components,
connector binding, transfer service, engine loop), from its own scenario
(:func:`sim.cluster.instances.instance_scenarios`), and all instances share the workload, drawn once with
the scenario's seed. Instance 0's connector draws from the run's connector stream; instance ``i > 0`` from
a child of it, so a one-instance cluster makes the same draws as the plain run.

Routing (:class:`ArrivalFeed`): the feed is a SimPy process that, at each arrival time and before any
engine step at that time (its events are scheduled URGENT), asks the router where the request goes and
hands it to that instance's loop, which adds it just before its next ``schedule()``: the one arrival
rule of a plain run. A closed-loop session's released turns go through the feed too. An instance's loop
is held open while the feed may still route requests to it.

Invariants: every request of the workload ends in exactly one ``requests`` row, on the instance it was
routed to, or on none (``instance = -1``: rejected as too long, or not arrived when the run stopped). A
crash on any instance stops the whole cluster (``on_crash: stop``), as a dead engine ends a run.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any, Callable

import numpy as np
import simpy
from simpy.events import URGENT

from sim.accel.hashing import SharedPrefixBlockHasher
from sim.cluster.instances import instance_scenarios
from sim.cluster.pd import PREFILL_LEG_SUFFIX, DecodePort, Disaggregation, PrefillPort
from sim.cluster.router import InstanceState, Router, create_router
from sim.cluster.tier import InstancePort, SharedTier, check_tier
from sim.cluster.view import KVCacheView
from sim.config.scenario import Scenario
from sim.config.yamlio import ScenarioError
from sim.connector.multi import connector_part
from sim.connector.offload import OffloadConnector
from sim.connector.remote import RemoteConnector
from sim.core.request import Request
from sim.engine.actions import build_actions
from sim.engine.build import Components, build_components, run_rngs, scenario_workload
from sim.engine.loop import EngineLoop, InvariantViolation, StopRun
from sim.engine.request_rows import record_unstarted
from sim.engine.run import (
    RunOptions,
    RunRecord,
    _step_duration_fn,
    _transfer_service,
    bind_connector,
    invariant_check,
    loop_record,
)
from sim.engine.sessions import SessionDriver
from sim.engine.stretch import StretchLoop, decode_run_of
from sim.interrupts import interruptible, pause_hook
from sim.trace.recorder import Recorder


@dataclass
class Instance:
    """One engine of the cluster, as the router sees it (:class:`~sim.cluster.router.InstanceState`)."""

    index: int
    components: Components
    view: KVCacheView
    loop: EngineLoop | None = None
    #: The requests routed here, in routing order.
    routed: list[Request] = field(default_factory=list)

    def queued(self) -> int:
        running, waiting = self.components.scheduler.get_request_counts()
        assert self.loop is not None
        return running + waiting + self.loop.num_pending_arrivals

    def load(self) -> float:
        return self.queued() / self.components.scheduler.config.max_num_seqs

    def kv_usage(self) -> float:
        return float(self.components.kv_manager.usage)


@dataclass
class _Numbered:
    """An instance as one router of a subset sees it (a P/D cluster's prefill or decode instances):
    ``index`` is its position in the subset."""

    instance: Instance
    index: int

    @property
    def view(self) -> KVCacheView:
        return self.instance.view

    def queued(self) -> int:
        return self.instance.queued()

    def load(self) -> float:
        return self.instance.load()

    def kv_usage(self) -> float:
        return self.instance.kv_usage()


class ArrivalFeed:
    """Routes each request at its arrival time (see the module docstring).

    Each submitted request gets one URGENT SimPy event at its arrival time whose callback routes it: URGENT
    events at a time run before the engine steps at that time, and equal times route in submission order
    (the workload's arrival order, then the order sessions release turns), as a plain run admits them.
    """

    def __init__(
        self,
        env: simpy.Environment,
        instances: list[Instance],
        router: Router,
        hasher: SharedPrefixBlockHasher | None,
    ) -> None:
        self.env = env
        self.instances = instances
        self.router = router
        self.hasher = hasher
        self.sessions: SessionDriver | None = None
        #: Submitted requests not routed yet, by id, in submission order.
        self._pending: dict[str, Request] = {}
        #: A P/D cluster: the proxy, the router of the prefill instances and both subsets (instance indices).
        self.pd: Disaggregation | None = None
        self.prefill_router: Router | None = None
        self.prefill_ids: list[int] = []
        self.decode_ids: list[int] = list(range(len(instances)))

    def submit(self, request: Request) -> None:
        """Route ``request`` at its ``arrival_time`` (not in the past)."""
        delay = float(request.arrival_time) - float(self.env.now)
        assert delay >= 0, (request.request_id, request.arrival_time, self.env.now)
        self._pending[request.request_id] = request
        event = simpy.Event(self.env)
        event._ok = True
        event._value = None
        event.callbacks.append(lambda _event: self._route(request))
        self.env.schedule(event, URGENT, delay)

    @property
    def unrouted(self) -> list[Request]:
        """Requests not routed yet (the run stopped before their arrival), in arrival order."""
        return sorted(self._pending.values(), key=lambda r: r.arrival_time)

    def may_route(self) -> bool:
        """Whether a request may still be routed: one is pending, or a running one may release a turn."""
        if self._pending or (self.pd is not None and self.pd.busy()):
            return True
        if self.sessions is None:
            return False
        return any(i.components.scheduler.has_unfinished_requests() or i.queued() for i in self.instances)

    def recheck_all(self) -> None:
        """No more requests will be routed: every idle instance looks again whether it ends (or stalls), without
        a step (:meth:`~sim.engine.loop.EngineLoop.recheck`)."""
        for instance in self.instances:
            assert instance.loop is not None
            instance.loop.recheck()

    def _route(self, request: Request) -> None:
        del self._pending[request.request_id]
        if self.hasher is not None and request.hash_block_size == 0:
            request.set_block_hasher(self.hasher)
        now = float(self.env.now)
        for instance in self.instances:
            instance.view.advance(now)
        index = self._choose(self.router, request, self.decode_ids)
        if self.pd is not None:
            assert self.prefill_router is not None
            self.pd.start(request, self._choose(self.prefill_router, request, self.prefill_ids), index)
        self.hand(index, request)
        if not self.may_route():
            self.recheck_all()

    def hand(self, index: int, request: Request) -> None:
        """Give ``request`` to instance ``index`` now."""
        instance = self.instances[index]
        instance.routed.append(request)
        assert instance.loop is not None
        instance.loop.release(request)
        instance.loop.wake()

    def _choose(self, router: Router, request: Request, ids: list[int]) -> int:
        """The instance ``router`` picks among ``ids`` (every instance, or a P/D cluster's subset)."""
        states: list[InstanceState]
        if len(ids) == len(self.instances):
            states = list(self.instances)
        else:
            states = [_Numbered(self.instances[i], n) for n, i in enumerate(ids)]
        pick = router.choose(request, states, self.instances[0].components.kv_cache_config)
        if not 0 <= pick < len(states):
            raise ValueError(f"cluster.router.policy: the router chose instance {pick} of {len(states)}")
        return ids[pick]


@dataclass
class ClusterRecord:
    """What :meth:`ClusterRun.execute` leaves: one :class:`RunRecord` per instance, the requests routed
    nowhere (rejected or never arrived, in a recorder of their own) and how the cluster ended."""

    scenario: Scenario
    instances: list[RunRecord]
    unrouted: Recorder
    routing: dict[str, int]
    status: str
    message: str
    crash: dict[str, Any] | None
    simulated_s: float
    #: The shared KV tier (``cluster.tier``), or ``None``.
    tier: SharedTier | None = None
    #: A P/D cluster's proxy, or ``None``.
    pd: Disaggregation | None = None
    #: Every runnable request of the workload, in workload order (the session tables read it).
    workload: list[Request] = field(default_factory=list)


class ClusterRun:
    """A wired cluster run (what :func:`build_cluster_run` returns); :meth:`execute` it once."""

    def __init__(
        self,
        scenario: Scenario,
        env: simpy.Environment,
        instances: list[Instance],
        feed: ArrivalFeed,
        rejected: list[Request],
        tier: SharedTier | None = None,
        rebuild: Callable[[], ClusterRun] | None = None,
        workload: list[Request] | None = None,
    ) -> None:
        #: The same run without quiet stretches (:mod:`sim.engine.stretch`), for a stop that a stretch
        #: cannot settle exactly. It is built from the scenario again: a caller that changes the wired run
        #: after the build (wraps a connector, say) builds it with ``stretches=False`` instead.
        self.rebuild = rebuild
        self.scenario = scenario
        self.tier = tier
        self.env = env
        self.instances = instances
        self.feed = feed
        self.rejected = rejected
        #: Every runnable request, in workload order.
        self.workload = workload or []
        self._executed = False

    def execute(self) -> ClusterRecord:
        """Simulate every instance to the end (or to whatever stops the cluster) and return the record."""
        if self._executed:
            raise RuntimeError("ClusterRun.execute() was already called; build a new run")
        self._executed = True
        loops = [i.loop for i in self.instances if i.loop is not None]
        status, message = "complete", ""
        try:
            with interruptible():  # inside sim.run_scenario's deferred section: a signal stops the loop
                self.env.run(until=simpy.AllOf(self.env, [loop.process for loop in loops]))
        except StopRun as stop:
            message = str(stop)
            crashed = any(loop.crash is not None for loop in loops)
            status = "crashed" if crashed else ("stalled" if any(loop.stalled for loop in loops) else "stopped")
        except InvariantViolation as exc:
            status, message = "invariant_violation", str(exc)
        except KeyboardInterrupt as exc:
            status, message = "interrupted", str(exc) or "interrupted (Ctrl-C)"
        except RuntimeError as exc:
            if "No scheduled events left" not in str(exc):
                raise
            status, message = "stalled", "stalled: requests are waiting on an instance but none can be scheduled"
        finally:
            for loop in loops:
                loop.close()
        if status == "complete" and any(loop.stalled for loop in loops):
            # An instance that stalled ended alone; the others ran to their end.
            stuck = [i.index for i in self.instances if i.loop is not None and i.loop.stalled]
            status = "stalled"
            message = (
                f"stalled: requests are waiting on instance(s) {', '.join(map(str, stuck))} but none can be scheduled"
            )
        settled = [loop.settle() for loop in loops if isinstance(loop, StretchLoop)]
        if not all(settled) and status != "interrupted" and self.rebuild is not None:
            return self.rebuild().execute()
        return self._record(status, message)

    def _record(self, status: str, message: str) -> ClusterRecord:
        records: list[RunRecord] = []
        crash: dict[str, Any] | None = None
        routing: dict[str, int] = {}
        think_used = dict(self.feed.sessions.think_used) if self.feed.sessions is not None else {}
        for instance in self.instances:
            loop = instance.loop
            assert loop is not None
            components = replace(instance.components, requests=list(instance.routed), rejected=[])
            record = loop_record(components, loop, status, message, float(self.env.now), think_used)
            records.append(record)
            for request in instance.routed:
                routing[request.request_id] = instance.index
            c = record.crash
            if c is not None and (crash is None or (c["time_s"], c["step"]) < (crash["time_s"], crash["step"])):
                crash = dict(c, instance=instance.index)
        unrouted = Recorder(len(self.instances[0].components.kv_cache_config.groups), record_schedule=False)
        for request in self.rejected:
            record_unstarted(unrouted, request, "rejected")
        for request in self.feed.unrouted:
            record_unstarted(unrouted, request, "not_arrived")
        return ClusterRecord(
            scenario=self.scenario,
            instances=records,
            unrouted=unrouted,
            routing=routing,
            status=status,
            message=message,
            crash=crash,
            simulated_s=float(self.env.now),
            tier=self.tier,
            pd=self.feed.pd,
            workload=self.workload,
        )


def check_cluster(scenario: Scenario, workload: tuple[list[Request], list[Request]] | None = None) -> list[Scenario]:
    """Refuse a cluster that cannot run (an instance override, the router), before anything runs; the
    instances' scenarios. ``workload``: the requests already drawn (else each instance's check draws them)."""
    cluster = scenario.cluster
    assert cluster is not None
    if cluster.tier is not None and scenario.connector.type != "none":
        raise ScenarioError(
            f"cluster.tier: every instance's connector is the shared tier's; remove connector "
            f"(connector.type: {scenario.connector.type!r}; valid with a tier: none)"
        )
    if cluster.disaggregated and scenario.connector.type != "none":
        raise ScenarioError(
            f"cluster.instances: prefill and decode instances use the P/D connector (NIXL-like); remove connector "
            f"(connector.type: {scenario.connector.type!r}; valid with P/D: none)"
        )
    scenarios = instance_scenarios(scenario)
    layout = _layout(scenarios[0])
    for i, s in enumerate(scenarios[1:], start=1):
        if _layout(s) != layout:
            raise ScenarioError(f"cluster.instances.{i}: changes the cache layout; every instance shares the model's")
    _router(scenario)
    if cluster.tier is not None:
        from sim.engine.build import build_kv_cache_config

        try:
            check_tier(cluster.tier, build_kv_cache_config(scenarios[0]))
        except ValueError as exc:
            raise ScenarioError(str(exc)) from None
    for i, s in enumerate(scenarios):
        try:
            build_components(s, dry_run=True, workload=workload)
        except ScenarioError as exc:
            raise ScenarioError(f"cluster.instances.{i}: {exc}") from None
    return scenarios


def _layout(scenario: Scenario) -> tuple[Any, ...]:
    from sim.engine.build import build_kv_cache_config

    config = build_kv_cache_config(scenario)
    return (config.hash_block_size, tuple((g.spec.kind, g.spec.block_size) for g in config.groups))


def _router(scenario: Scenario) -> Router:
    cluster = scenario.cluster
    assert cluster is not None
    r = cluster.router
    try:
        return create_router(r.policy, r.group_aware, r.load_weight, r.options)
    except ValueError as exc:
        raise ScenarioError(str(exc)) from None


def build_cluster_run(scenario: Scenario, options: RunOptions | None = None, *, stretches: bool = True) -> ClusterRun:
    """Wire every instance of ``scenario`` (which has a ``cluster`` section) and the arrival feed. With the fast
    paths, an instance takes quiet stretches of steps as one event (:mod:`sim.engine.stretch`) unless
    ``stretches`` is False."""
    options = options or RunOptions()
    stretches = stretches and options.use_fast_paths()
    cluster = scenario.cluster
    assert cluster is not None
    requests, rejected = scenario_workload(instance_scenarios(scenario)[0])
    if cluster.disaggregated:
        for request in requests:
            if request.request_id.endswith(PREFILL_LEG_SUFFIX):
                raise ScenarioError(
                    f"workload: request id {request.request_id!r} ends with {PREFILL_LEG_SUFFIX!r}, which a P/D "
                    "cluster gives the prefill legs; rename it"
                )
    scenarios = check_cluster(scenario, (requests, []))
    env = simpy.Environment()
    connector_rngs = _connector_rngs(scenario.seed, len(scenarios))
    instances: list[Instance] = []
    for index, instance_scenario in enumerate(scenarios):
        components = build_components(instance_scenario, fast_paths=options.use_fast_paths(), workload=(requests, []))
        assert components is not None
        view = KVCacheView(len(components.kv_cache_config.groups), cluster.router.view_delay)
        instances.append(Instance(index, components, view))
    config = instances[0].components.kv_cache_config
    hasher = SharedPrefixBlockHasher(config.hash_block_size) if cluster.router.policy == "prefix_aware" else None
    sessions = None
    spec = scenario.workload.sessions
    if spec is not None and spec.mode == "closed":
        sessions = SessionDriver(requests, spec)
    feed = ArrivalFeed(env, instances, _router(scenario), hasher)
    feed.sessions = sessions
    if sessions is not None:
        sessions.release = feed.submit
    tier = _shared_tier(scenario, instances, env)
    _disaggregate(scenario, instances, feed)
    for instance, rng in zip(instances, connector_rngs):
        instance.loop = _instance_loop(env, instance, rng, options, feed, stretches)
    if tier is not None:
        connector = connector_part(instances[0].components.connector, OffloadConnector)
        assert connector is not None
        tier.chunk_tokens = connector.C
    for request in sorted(sessions.initial if sessions else requests, key=lambda r: r.arrival_time):
        feed.submit(request)
    rebuild = (lambda: build_cluster_run(scenario, options, stretches=False)) if stretches else None
    return ClusterRun(scenario, env, instances, feed, rejected, tier, rebuild, workload=requests)


def _disaggregate(scenario: Scenario, instances: list[Instance], feed: ArrivalFeed) -> None:
    """Wire a P/D cluster's proxy (:mod:`sim.cluster.pd`) into the feed and every instance's ``remote``
    connector, before they are bound."""
    cluster = scenario.cluster
    assert cluster is not None
    if not cluster.disaggregated:
        return
    roles = [spec.role for spec in cluster.instance_specs()]
    feed.prefill_ids = [i for i, role in enumerate(roles) if role == "prefill"]
    feed.decode_ids = [i for i, role in enumerate(roles) if role == "decode"]
    feed.prefill_router = _router(scenario)

    def wake(index: int) -> None:
        loop = instances[index].loop
        assert loop is not None
        loop.wake()

    pd = Disaggregation(release=feed.hand, wake=wake, on_idle=feed.recheck_all)
    feed.pd = pd
    for instance, role in zip(instances, roles):
        connector = connector_part(instance.components.connector, RemoteConnector)
        assert connector is not None, "instance_scenarios gives P/D instances the remote connector"
        if role == "decode":
            connector.prefill_side = DecodePort(pd)
        else:
            connector.producer = PrefillPort(pd, instance.index)


def _shared_tier(scenario: Scenario, instances: list[Instance], env: simpy.Environment) -> SharedTier | None:
    """The cluster's shared KV tier, handed to every instance's (offload) connector before it is bound."""
    cluster = scenario.cluster
    assert cluster is not None
    if cluster.tier is None:
        return None
    tier = SharedTier(cluster.tier, instances[0].components.group_kinds, lambda: float(env.now))
    for instance in instances:
        connector = connector_part(instance.components.connector, OffloadConnector)
        assert connector is not None, "instance_scenarios gives each instance the offload connector"
        connector.backend = InstancePort(tier, instance.index)
    return tier


def _connector_rngs(seed: int, count: int) -> list[np.random.Generator]:
    first = run_rngs(seed).connector
    return [first] + list(first.spawn(count - 1)) if count > 1 else [first]


def _instance_loop(
    env: simpy.Environment,
    instance: Instance,
    rng: np.random.Generator,
    options: RunOptions,
    feed: ArrivalFeed,
    stretches: bool,
) -> EngineLoop:
    components = instance.components
    scenario = components.scenario
    transfers = _transfer_service(env, scenario.clock)
    # The router's view hears every batch of KV events the instance records (the scheduler's and the actions').
    components.recorder.kv_event_listener = instance.view.publish
    connector = components.connector
    bind_connector(components, rng, transfers)
    check = invariant_check(components, options)

    def on_finished(finished: list[Request], now: float) -> None:
        if feed.sessions is not None:
            feed.sessions.on_finished(finished, now)
        if not feed.may_route():
            feed.recheck_all()

    loop_cls: type[EngineLoop] = EngineLoop
    extra: dict[str, Any] = {}
    # Quiet stretches (sim.engine.stretch): the feed releases each request at its arrival, before any step at
    # that time, which cuts a stretch exactly. Not with closed-loop sessions: a finish releases a turn at a time
    # other instances' steps share, and what those steps see then depends on SimPy's order of equal-time events.
    # (A connector, hence a tier or P/D, rules stretches out too.)
    if stretches and connector is None and feed.sessions is None:
        loop_cls = StretchLoop
        extra = {"decode_run": decode_run_of(scenario.clock, components.step_time_model)}
    return loop_cls(
        env=env,
        scheduler=components.scheduler,
        requests=[],
        clock=scenario.clock,
        step_duration=_step_duration_fn(components),
        recorder=components.recorder,
        kv_manager=components.kv_manager,
        connector=connector,
        transfers=transfers,
        actions=build_actions(scenario, components),
        on_crash=scenario.on_crash,
        check_invariants=check,
        step_columns=connector.step_columns if connector is not None else None,
        progress=pause_hook("run"),
        max_steps=options.max_steps,
        on_finished=on_finished,
        held_open=feed.may_route,
        stall_ends_loop=True,
        **extra,
    )
