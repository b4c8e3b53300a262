"""The scheduler test harness: one Scheduler over one KVCacheManager, stepped like the step-clock engine.

``Harness.run_step()`` hands the connector's finished transfers over, then
calls ``schedule()`` and ``update_from_output()``; the recorder's
``schedule`` / ``admissions`` rows are read back as tuples.
"""

from __future__ import annotations

import numpy as np

from sim.accel import QuietDecodeScheduler, QuietKVCacheManager
from sim.connector.context import ConnectorContext, GroupLayout
from sim.core.kv.eviction import EvictionContext
from sim.core.kv.kv_cache_manager import KVCacheManager
from sim.core.kv.specs import kv_cache_config_from_groups
from sim.core.policy.eviction import eviction_policy_for_placement
from sim.core.request import Request, RequestStatus
from sim.core.scheduler import Scheduler, SchedulerConfig
from sim.core.tokens import StreamSegment
from sim.trace.recorder import Recorder


def req(rid, tokens, max_tokens=1, content=None, **kw) -> Request:
    return Request(rid, [StreamSegment(content or rid, 0, tokens)], max_tokens=max_tokens, **kw)


class Harness:
    def __init__(
        self,
        groups=("full_attention",),
        num_blocks=100,
        block_size=16,
        retention=None,
        connector=None,
        policy="reconciled",
        on_crash="stop",
        sched_policy="fcfs",
        fast_paths=False,
        checkpoint_policy=None,
        eviction_policy=None,
        **sched,
    ):
        self.kv_cfg = kv_cache_config_from_groups(
            groups, block_size=block_size, num_blocks=num_blocks, retention_interval=retention
        )
        if checkpoint_policy is not None:  # as the engine builds it: a what-if placement needs a policy pool
            eviction_policy = eviction_policy_for_placement(eviction_policy)
        # The plain core by default; ``fast_paths`` builds the speed layer's manager and scheduler where they apply.
        fast = fast_paths and QuietKVCacheManager.supports(self.kv_cfg)
        self.kv = (QuietKVCacheManager if fast else KVCacheManager)(
            self.kv_cfg,
            eviction_policy=eviction_policy,
            eviction_context=EvictionContext(prefill_flops=lambda p: float(p * p)),
        )
        self.rec = Recorder(len(self.kv_cfg.groups))
        if connector is not None:
            connector.bind(
                ConnectorContext(
                    groups=tuple(
                        GroupLayout(i, g.spec.kind, g.spec.block_size, 0) for i, g in enumerate(self.kv_cfg.groups)
                    ),
                    clock="steps",
                    rng=np.random.default_rng(0),
                    transfers=None,
                )
            )
        self.connector = connector
        self.sched = (QuietDecodeScheduler if fast else Scheduler)(
            SchedulerConfig(policy=sched_policy, **sched),
            self.kv,
            connector,
            policy,
            self.rec,
            on_crash=on_crash,
            checkpoint_policy=checkpoint_policy,
        )
        self.step = 0
        self.finished: dict[str, int] = {}
        self.status: dict[str, RequestStatus] = {}

    def add(self, *requests):
        for r in requests:
            self.sched.add_request(r)

    def run_step(self):
        self.rec.set_clock(self.step, float(self.step))
        self.sched.step = self.step
        if self.connector is not None:
            self.sched.update_from_kv_xfer_finished(*self.connector.get_finished())
        out = self.sched.schedule()
        for r in self.sched.update_from_output(out):
            self.finished[r.request_id] = self.step
            self.status[r.request_id] = r.status
        self.step += 1
        return out

    def schedule_rows(self):
        d = self.rec.schedule.data
        return [
            (
                d["step"][i],
                d["request_id"][i],
                d["kind"][i],
                d["num_scheduled_tokens"][i],
                d["num_computed_tokens"][i],
                d["preempted"][i],
            )
            for i in range(len(self.rec.schedule))
        ]

    def admission_rows(self, *cols):
        d = self.rec.admissions.data
        cols = cols or ("step", "request_id", "kind", "local_tokens", "external_tokens", "outcome", "reason")
        return [tuple(d[c][i] for c in cols) for i in range(len(self.rec.admissions))]
