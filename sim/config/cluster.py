"""The ``cluster:`` section of a scenario: several serving instances behind a router (docs/cluster.md).

A scenario without ``cluster`` is one instance, exactly as before. With it, every instance is a whole
vLLM engine (scheduler, KV-cache manager, connector) built from the scenario, with the per-instance
overrides given here; all instances share one simulated clock and one workload, and the router sends each
arriving request to one instance.

Invariants checked here: every instance has the same model and cache layout as the scenario (block size,
groups, Mamba mode), so a request's block hashes mean the same on every instance; an override names only
keys an instance may change (its cache size and eviction policy, its scheduler, its hardware).
"""

# No ``from __future__ import annotations`` here: pydantic would compile and evaluate every annotation string
# as it builds each model class (about 0.006 s of every command that loads a scenario, docs/speed.md).
from typing import Annotated, Any, Literal, Union

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    PositiveInt,
    StrictBool,
    field_serializer,
    field_validator,
    model_validator,
)

#: Most instances a cluster may have (each is a whole engine in this process).
MAX_INSTANCES = 64

#: Keys an instance override may set, per section; the rest of the scenario is shared.
INSTANCE_KEYS: dict[str, tuple[str, ...]] = {
    "cache": ("num_blocks", "kv_memory_gb", "eviction_policy", "eviction_options"),
    "scheduler": (
        "max_num_seqs",
        "max_num_batched_tokens",
        "long_prefill_token_threshold",
        "policy",
        "prefix_policy",
        "watermark",
    ),
    "hardware": ("preset", "gpu_memory_utilization", "overrides", "overrides_path"),
}


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", defer_build=True)


#: A positive, finite rate or size with a documented ceiling (GB, GB/s).
_Positive = Annotated[float, Field(gt=0, le=1e9, allow_inf_nan=False)]
#: A link's base latency, microseconds.
_LatencyUs = Annotated[float, Field(ge=0, le=1e9, allow_inf_nan=False)]
#: ``clock: steps``: a transfer's length in the engine's steps.
_Steps = Annotated[int, Field(ge=0, le=1_000_000)]


class TierSection(_Strict):
    """``cluster.tier``: a KV store every instance shares (LMCache-like; :mod:`sim.cluster.tier`).

    Every instance's connector is then the offload connector (:mod:`sim.connector.offload`) on this one
    store: what one instance stores, another instance's lookup finds. FA chunks and Mamba states are
    separate objects with their own sizes and LRU positions, so the tier can hold a prefix's FA chunks
    and not the Mamba state at their end.
    """

    #: Size of the store in GB (1e9 bytes), over all groups.
    capacity_gb: _Positive
    #: Bandwidth from the store to the instances (loads), GB/s, shared by every load in flight.
    read_gbps: _Positive = 25.0
    #: Bandwidth from the instances to the store (stores), GB/s, shared by every store in flight.
    write_gbps: _Positive = 25.0
    #: Base latency of one transfer to or from the store, microseconds.
    latency_us: _LatencyUs = 20.0
    #: At most this many transfers in flight per direction (the rest wait FIFO); null: processor sharing.
    concurrency: PositiveInt | None = None
    #: ``clock: steps``: a transfer completes this many of the instance's steps after it started.
    transfer_steps: _Steps = 1
    #: Tokens per stored object (a multiple of the scheduler block size); null: LMCache's 256 rounded up.
    chunk_tokens: PositiveInt | None = None
    #: When an instance writes: ``on_compute`` (each step's completed chunks) or ``on_finish``.
    store: Literal["on_compute", "on_finish"] = "on_compute"
    #: Eviction order of the store (least recently used object first).
    eviction: Literal["lru"] = "lru"
    #: ``shared`` (one budget, the LRU object of any group goes first) or a fraction of the capacity per group.
    group_capacity: Union[Literal["shared"], list[Annotated[float, Field(gt=0, le=1)]]] = "shared"

    def connector_options(self) -> dict[str, Any]:
        """The offload connector's options for one instance on this tier (links and storage come from the tier)."""
        return {
            "capacity_gb": self.capacity_gb,
            "store": self.store,
            "chunk_tokens": self.chunk_tokens,
            "bandwidth_gbps": self.read_gbps,
            "latency_us": self.latency_us,
            "concurrency": self.concurrency,
            "transfer_steps": self.transfer_steps,
            "group_capacity": self.group_capacity,
        }


#: What an instance serves: whole requests (``both``), only prompts (``prefill``) or the rest (``decode``).
Role = Literal["both", "prefill", "decode"]


class InstanceSpec(_Strict):
    """One instance's overrides of the scenario (``cluster.instances: [{cache: {num_blocks: 800}}, ...]``)."""

    #: ``prefill`` and ``decode`` instances split each request (:mod:`sim.cluster.pd`); ``both`` runs it whole.
    role: Role = "both"
    cache: dict[str, Any] = Field(default_factory=dict)
    scheduler: dict[str, Any] = Field(default_factory=dict)
    hardware: dict[str, Any] = Field(default_factory=dict)

    @model_validator(mode="after")
    def _known_keys(self) -> "InstanceSpec":
        for section, allowed in INSTANCE_KEYS.items():
            for key in getattr(self, section):
                if key not in allowed:
                    raise ValueError(
                        f"@{section}.{key}: an instance may override only {', '.join(allowed)} in {section} "
                        "(the model and cache layout are the cluster's)"
                    )
        return self

    def overrides(self) -> dict[str, dict[str, Any]]:
        """The non-empty sections, as a partial scenario mapping."""
        return {s: dict(getattr(self, s)) for s in INSTANCE_KEYS if getattr(self, s)}

    def is_plain(self) -> bool:
        """No override and the default role."""
        return self.role == "both" and not self.overrides()


class RouterSection(_Strict):
    """How arriving requests are sent to instances (``cluster.router``)."""

    #: ``round_robin``, ``least_loaded``, ``session_affinity``, ``prefix_aware`` or an installed plug-in
    #: (entry point group ``hybridsim.routers``).
    policy: str = Field(default="round_robin", min_length=1)
    #: ``prefix_aware``: count only the prefix a hybrid model can use (every group's blocks present,
    #: a Mamba state at the boundary), not the full-attention prefix alone.
    group_aware: StrictBool = False
    #: ``prefix_aware``: weight of an instance's load against its cached fraction of the prompt
    #: (score = cached fraction - load_weight * load, load = queued requests / max_num_seqs).
    load_weight: Annotated[float, Field(ge=0, le=1e6, allow_inf_nan=False)] = 1.0
    #: How late the instances' KV events reach the router's view (seconds with ``clock: time``, steps
    #: with ``clock: steps``); 0 is an exact view.
    view_delay: Annotated[float, Field(ge=0, le=1e9, allow_inf_nan=False)] = 0.0
    #: A plug-in router's own options.
    options: dict[str, Any] = Field(default_factory=dict)


class PDLinkSection(_Strict):
    """``cluster.pd``: the link a decode instance pulls a request's KV over from a prefill instance (NIXL-like)."""

    #: The decode instance's network bandwidth, GB/s, shared by its pulls in flight.
    bandwidth_gbps: _Positive = 25.0
    #: Base latency of one pull (RDMA read plus NIXL's notification), microseconds.
    latency_us: _LatencyUs = 20.0
    #: At most this many pulls in flight per decode instance (the rest wait FIFO); null: processor sharing.
    concurrency: PositiveInt | None = None
    #: ``clock: steps``: a pull completes this many of the decode instance's steps after it started.
    transfer_steps: _Steps = 1

    def connector_options(self) -> dict[str, Any]:
        """The ``remote`` connector's options of a decode instance."""
        return {
            "bandwidth_gbps": self.bandwidth_gbps,
            "latency_us": self.latency_us,
            "concurrency": self.concurrency,
            "transfer_steps": self.transfer_steps,
        }


class ClusterSection(_Strict):
    """``cluster:``: how many instances (or each one's overrides) and the router."""

    #: Given as a count or a list of overrides; held as the list (a count is that many empty overrides) and
    #: written back as the count when no instance has an override.
    instances: list[InstanceSpec] = Field(default_factory=lambda: [InstanceSpec(), InstanceSpec()])
    router: RouterSection = Field(default_factory=RouterSection)
    #: A KV store shared by every instance; ``None``: each instance's connector is its own.
    tier: TierSection | None = None
    #: The prefill-to-decode KV link of a cluster with ``prefill`` and ``decode`` instances (``None``: the
    #: defaults of :class:`PDLinkSection`).
    pd: PDLinkSection | None = None

    @field_validator("instances", mode="before")
    @classmethod
    def _instance_count(cls, value: Any) -> Any:
        """A count in ``[1, MAX_INSTANCES]`` or a list of that many override mappings."""
        if isinstance(value, bool) or not isinstance(value, (int, list)):
            raise ValueError(f"expected a count or a list of instance overrides, got {type(value).__name__}")
        n = value if isinstance(value, int) else len(value)
        if not 1 <= n <= MAX_INSTANCES:
            raise ValueError(f"a cluster has 1 to {MAX_INSTANCES} instances (got {n})")
        return [{} for _ in range(n)] if isinstance(value, int) else value

    @field_serializer("instances")
    def _as_count_when_plain(self, instances: list[InstanceSpec]) -> int | list[dict[str, Any]]:
        if all(spec.is_plain() for spec in instances):
            return len(instances)
        return [spec.model_dump() for spec in instances]

    @model_validator(mode="after")
    def _roles(self) -> "ClusterSection":
        """Either every instance runs whole requests, or there are prefill and decode instances and no other."""
        roles = [spec.role for spec in self.instances]
        if set(roles) == {"both"}:
            if self.pd is not None:
                raise ValueError("@pd: the P/D link needs prefill and decode instances (cluster.instances[*].role)")
            return self
        for i, role in enumerate(roles):
            if role == "both":
                raise ValueError(
                    f"@instances.{i}.role: a cluster with prefill or decode instances has only those "
                    "(give every instance role: prefill or role: decode)"
                )
        for needed in ("prefill", "decode"):
            if needed not in roles:
                raise ValueError(f"@instances: a P/D cluster needs at least one {needed} instance (roles: {roles})")
        return self

    @property
    def disaggregated(self) -> bool:
        """Prefill and decode run on different instances."""
        return any(spec.role != "both" for spec in self.instances)

    def instance_specs(self) -> list[InstanceSpec]:
        """One spec per instance."""
        return list(self.instances)
