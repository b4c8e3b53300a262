"""Pydantic models of a whole scenario (docs/design.md §7); docs/scenarios.md lists every key.

Every model forbids unknown keys except ``connector`` (its own keys belong to
the connector, which validates them). Defaults that depend on other sections
(``scheduler.max_model_len``, the batch limits, ``cache.mamba_cache_mode``,
``outputs.schedule_table``) are ``None`` in the field and filled in by
:class:`Scenario`'s validator, so a validated scenario holds no ``None`` where a
value is implied, and dumping it and loading it back gives an equal scenario.

A validator that wants its message tied to a sub-key raises
``ValueError("@sub.key: message")``; the loader appends ``sub.key`` to the
error's key path.
"""

# No ``from __future__ import annotations`` here: pydantic would compile and evaluate every annotation string
# as it builds each model class (about 0.006 s of every command that loads a scenario, docs/speed.md).
import math
from dataclasses import replace
from typing import Annotated, Any, Literal, Union

from pydantic import (
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Discriminator,
    Field,
    StrictBool,
    Tag,
    field_validator,
    model_validator,
)

from sim.config.cluster import ClusterSection
from sim.config.presets import (
    DEFAULT_GPU_MEMORY_UTILIZATION,
    HARDWARE_PRESETS,
    MODEL_PRESETS,
    GiB,
    HardwarePreset,
    ModelPreset,
    hardware_preset,
    kv_memory_budget,
    model_preset,
)
from sim.config.vllm_versions import (
    DEFAULT_BLOCK_SIZE,
    KEY_DEFAULTS,
    KEYS_SINCE,
    NEWEST,
    VllmVersion,
    at_least,
    normalize,
)
from sim.config.yamlio import ScenarioError, did_you_mean, load_yaml_file
from sim.core.kv.shapes import AttentionLayerShape, LayerShape, MambaLayerShape, ModelShape
from sim.limits import MAX_INT, MAX_TIME_S
from sim.workload.spec import WorkloadSpec

# Every number has a finite range (docs/limits.md): integers at most MAX_INT (so arithmetic on them never
# meets a 400-digit int), times at most MAX_TIME_S, never NaN or infinity; divisors have a physical floor (a
# denormal bandwidth would make a step last 1e300 s).
PositiveInt = Annotated[int, Field(ge=1, le=MAX_INT)]
NonNegativeInt = Annotated[int, Field(ge=0, le=MAX_INT)]
PositiveFloat = Annotated[float, Field(gt=0, le=MAX_TIME_S, allow_inf_nan=False)]
NonNegativeFloat = Annotated[float, Field(ge=0, le=MAX_TIME_S, allow_inf_nan=False)]
Fraction = Annotated[float, Field(gt=0, le=1, allow_inf_nan=False)]
#: An efficiency of the step-time model (a fraction of peak it divides by): from 1e-6 to 1.
Efficiency = Annotated[float, Field(ge=1e-6, le=1, allow_inf_nan=False)]
#: A per-step time constant of the step-time model (seconds): at most an hour.
StepSeconds = Annotated[float, Field(ge=0, le=3600.0, allow_inf_nan=False)]
#: Bytes per second of a memory or link (1 MB/s .. 1 EB/s).
Bandwidth = Annotated[float, Field(ge=1e6, le=1e18, allow_inf_nan=False)]
#: Floating-point operations per second (1 GFLOP/s .. 1 ZFLOP/s).
Flops = Annotated[float, Field(ge=1e9, le=1e21, allow_inf_nan=False)]
#: GPU memory in bytes (1 MiB .. 1 PiB).
MemoryBytes = Annotated[int, Field(ge=1 << 20, le=1 << 50)]
#: KV-cache memory in GB (at most 1 PB).
MemoryGB = Annotated[float, Field(gt=0, le=1e6, allow_inf_nan=False)]

EXPLICIT_GROUPS_MAX_MODEL_LEN = 8192
"""docs/design.md §7: ``max_model_len`` when the scenario gives no model preset."""


class _Strict(BaseModel):
    """Unknown keys are errors; booleans must be YAML booleans (``true``/``false``), never ``"yes please"``
    or ``1``.

    Every model of the scenario (here, ``sim.config.cluster`` and ``sim.workload.spec``) defers its validator
    to its first use (``defer_build``): loading a scenario compiles one, :class:`Scenario`'s, instead of one
    per model at import (the same checks and messages; docs/speed.md)."""

    model_config = ConfigDict(extra="forbid", defer_build=True)


# --------------------------------------------------------------------------- model


class AttentionLayerSpec(_Strict):
    """``count`` identical attention layers (full attention, or sliding window with ``window``)."""

    type: Literal["full_attention", "sliding_window"]
    num_kv_heads: PositiveInt
    head_size: PositiveInt
    head_size_v: PositiveInt | None = None
    dtype_bytes: PositiveInt = 2
    window: PositiveInt | None = None
    count: PositiveInt = 1

    @model_validator(mode="after")
    def _window_matches_type(self) -> "AttentionLayerSpec":
        if self.type == "sliding_window" and self.window is None:
            raise ValueError("@window: a sliding_window layer needs 'window' (tokens)")
        if self.type == "full_attention" and self.window is not None:
            raise ValueError("@window: only a sliding_window layer has a window")
        return self

    def shape(self) -> AttentionLayerShape:
        return AttentionLayerShape(self.num_kv_heads, self.head_size, self.head_size_v, self.dtype_bytes, self.window)


class MambaLayerSpec(_Strict):
    """``count`` identical recurrent layers: state tensor shapes and their element sizes."""

    type: Literal["mamba"]
    state_shapes: list[list[PositiveInt]] = Field(min_length=1)
    state_dtype_bytes: list[PositiveInt] = Field(min_length=1)
    mixer: Literal["mamba1", "mamba2", "gdn", "short_conv"] = "mamba2"
    prefill_checkpoints: StrictBool = False
    count: PositiveInt = 1

    @model_validator(mode="after")
    def _one_dtype_per_tensor(self) -> "MambaLayerSpec":
        if len(self.state_shapes) != len(self.state_dtype_bytes):
            raise ValueError(
                f"@state_dtype_bytes: give one element size per state tensor "
                f"({len(self.state_shapes)} shapes, {len(self.state_dtype_bytes)} sizes)"
            )
        return self

    def shape(self) -> MambaLayerShape:
        return MambaLayerShape(
            tuple(tuple(s) for s in self.state_shapes),
            tuple(self.state_dtype_bytes),
            self.mixer,
            self.prefill_checkpoints,
        )


def _layer_kind(value: Any) -> str:
    kind = value.get("type") if isinstance(value, dict) else getattr(value, "type", None)
    return "mamba" if kind == "mamba" else "attention"


LayerSpec = Annotated[
    Union[Annotated[AttentionLayerSpec, Tag("attention")], Annotated[MambaLayerSpec, Tag("mamba")]],
    Discriminator(_layer_kind),
]


class ModelSection(_Strict):
    """``{preset: NAME}`` or an explicit ``layers:`` list (cache layout only; no step-time sizes)."""

    preset: str | None = None
    layers: list[LayerSpec] | None = None

    @field_validator("preset")
    @classmethod
    def _known_preset(cls, name: str | None) -> str | None:
        if name is not None:
            model_preset(name)
        return name

    @model_validator(mode="after")
    def _one_source(self) -> "ModelSection":
        if (self.preset is None) == (self.layers is None):
            raise ValueError("@preset: give exactly one of 'preset' or 'layers'")
        if self.layers is not None and not self.layers:
            raise ValueError("@layers: give at least one layer")
        return self

    @property
    def preset_obj(self) -> ModelPreset | None:
        return MODEL_PRESETS[self.preset] if self.preset is not None else None

    def layer_shapes(self) -> tuple[LayerShape, ...]:
        if self.preset is not None:
            return MODEL_PRESETS[self.preset].shape.layers
        assert self.layers is not None
        return tuple(layer.shape() for layer in self.layers for _ in range(layer.count))


# --------------------------------------------------------------------------- hardware


class HardwareOverrides(_Strict):
    """Replace a hardware preset's numbers or the step-time model's constants (``null`` keeps the default)."""

    memory_bytes: MemoryBytes | None = None
    memory_bandwidth: Bandwidth | None = None
    bf16_flops: Flops | None = None
    sm_count: Annotated[int, Field(ge=0, le=1 << 20)] | None = None
    step_overhead_s: StepSeconds | None = None
    per_request_overhead_s: StepSeconds | None = None
    compute_efficiency: Efficiency | None = None
    memory_efficiency: Efficiency | None = None
    kernel_floor_s: StepSeconds | None = None
    transition_k: Annotated[float, Field(ge=1, le=64, allow_inf_nan=False)] | None = None
    gemm_row_tile: Annotated[int, Field(ge=1, le=1 << 16)] | None = None
    attn_prefill_efficiency: Efficiency | None = None
    attn_context_efficiency: Efficiency | None = None
    attn_prefill_token_s: StepSeconds | None = None
    attn_decode_memory_efficiency: Efficiency | None = None
    attn_floor_s: StepSeconds | None = None
    attn_decode_ctas_per_sm: Annotated[int, Field(ge=0, le=1 << 16)] | None = None
    attn_decode_cta_bandwidth: Bandwidth | None = None
    elementwise_memory_efficiency: Efficiency | None = None
    small_op_floor_s: StepSeconds | None = None
    state_memory_efficiency: Efficiency | None = None
    state_floor_s: StepSeconds | None = None

    def given(self) -> dict[str, Any]:
        return {k: v for k, v in self.model_dump().items() if v is not None}


def read_overrides_file(path: str) -> HardwareOverrides:
    """``hardware.overrides_path``: a YAML file with an ``overrides`` mapping (``hybridsim timing fit`` writes one),
    read by the bounded loader."""
    from pydantic import ValidationError

    try:
        doc = load_yaml_file(path, "hardware overrides").data
    except ScenarioError as exc:
        raise ValueError(f"@overrides_path: {exc}") from None
    if not isinstance(doc, dict) or not isinstance(doc.get("overrides"), dict):
        raise ValueError(
            f"@overrides_path: {path} must be a mapping with an 'overrides' mapping (as timing fit writes)"
        )
    extra = sorted(set(doc) - {"overrides", "fitted_on", "source"})
    if extra:
        raise ValueError(f"@overrides_path: {path}: unknown key(s) {extra} (valid: overrides, fitted_on, source)")
    try:
        return HardwareOverrides.model_validate(doc["overrides"])
    except ValidationError as exc:
        err = exc.errors()[0]
        key = ".".join(str(x) for x in err["loc"])
        valid = ", ".join(HardwareOverrides.model_fields)
        raise ValueError(f"@overrides_path: {path}: overrides.{key}: {err['msg']} (valid keys: {valid})") from None


class HardwareSection(_Strict):
    preset: str
    gpu_memory_utilization: Fraction = DEFAULT_GPU_MEMORY_UTILIZATION
    overrides: HardwareOverrides = Field(default_factory=HardwareOverrides)
    overrides_path: str | None = None
    """A YAML file of overrides (``hybridsim timing fit -o``); the inline ``overrides`` win over it."""

    @model_validator(mode="after")
    def _merge_overrides_file(self) -> "HardwareSection":
        if self.overrides_path:
            from_file = read_overrides_file(self.overrides_path).given()
            self.overrides = HardwareOverrides(**{**from_file, **self.overrides.given()})
        return self

    @field_validator("preset")
    @classmethod
    def _known_preset(cls, name: str) -> str:
        hardware_preset(name)
        return name

    def preset_obj(self) -> HardwarePreset:
        """The preset with ``memory_bytes`` / ``memory_bandwidth`` / ``bf16_flops`` / ``sm_count`` overrides applied."""
        hw = HARDWARE_PRESETS[self.preset]
        keys = ("memory_bytes", "memory_bandwidth", "bf16_flops", "sm_count")
        given = {k: v for k, v in self.overrides.given().items() if k in keys}
        return replace(hw, **given) if given else hw


# --------------------------------------------------------------------------- cache


class FullAttentionGroup(_Strict):
    type: Literal["full_attention"]
    #: This group's block size; ``None`` = ``cache.block_size``.
    block_size: PositiveInt | None = None


class SlidingWindowGroup(_Strict):
    type: Literal["sliding_window"]
    window: PositiveInt
    block_size: PositiveInt | None = None


class MambaGroup(_Strict):
    type: Literal["mamba"]
    prefill_checkpoints: StrictBool = False
    block_size: PositiveInt | None = None


GROUP_TYPES = ("full_attention", "sliding_window", "mamba")


def _group_shorthand(value: Any) -> Any:
    """A bare type name ``mamba`` means ``{type: mamba}``."""
    if isinstance(value, str):
        if value not in GROUP_TYPES:
            raise ValueError(
                f"unknown group type {value!r}{did_you_mean(value, GROUP_TYPES)} (valid: {', '.join(GROUP_TYPES)})"
            )
        return {"type": value}
    return value


def _group_kind(value: Any) -> str | None:
    kind = value.get("type") if isinstance(value, dict) else getattr(value, "type", None)
    return kind if kind in GROUP_TYPES else None


GroupSpec = Annotated[
    Union[
        Annotated[FullAttentionGroup, Tag("full_attention")],
        Annotated[SlidingWindowGroup, Tag("sliding_window")],
        Annotated[MambaGroup, Tag("mamba")],
    ],
    Discriminator(
        _group_kind,
        custom_error_type="group_type",
        custom_error_message=f"a group needs 'type', one of: {', '.join(GROUP_TYPES)}",
    ),
    BeforeValidator(_group_shorthand),
]


class CacheSection(_Strict):
    block_size: PositiveInt = 16
    num_blocks: Annotated[int, Field(ge=2)] | None = None
    kv_memory_gb: MemoryGB | None = None
    enable_prefix_caching: StrictBool = True
    mamba_cache_mode: Literal["align", "none"] | None = None
    retention_interval: NonNegativeInt | None = 0
    groups: list[GroupSpec] | None = None
    corrected_mamba_accounting: StrictBool = False
    #: ``lru`` is vLLM; anything else is a what-if (sim.core.policy.eviction); checked when the run is built.
    eviction_policy: str = Field(default="lru", min_length=1)
    eviction_options: dict[str, Any] = Field(default_factory=dict)
    #: ``vllm`` is vLLM's align-mode placement; anything else is a what-if (sim.core.policy.checkpoint).
    mamba_checkpoint_policy: str = Field(default="vllm", min_length=1)
    mamba_checkpoint_options: dict[str, Any] = Field(default_factory=dict)

    @field_validator("num_blocks")
    @classmethod
    def _bounded_blocks(cls, value: int | None) -> int | None:
        from sim.limits import limit, over

        if value is not None and value > limit("num_blocks"):
            raise ValueError(over("num_blocks", value, f"{value} blocks"))
        return value

    @model_validator(mode="after")
    def _consistent(self) -> "CacheSection":
        if self.num_blocks is not None and self.kv_memory_gb is not None:
            raise ValueError("@kv_memory_gb: give cache.num_blocks or cache.kv_memory_gb, not both")
        derived: Literal["align", "none"] = "align" if self.enable_prefix_caching else "none"
        if self.mamba_cache_mode is None:
            self.mamba_cache_mode = derived
        elif self.mamba_cache_mode != derived:
            raise ValueError(
                f"@mamba_cache_mode: {self.mamba_cache_mode!r} contradicts enable_prefix_caching: "
                f"{str(self.enable_prefix_caching).lower()} (vLLM 0.33 derives it: 'align' with prefix caching, "
                f"'none' without)"
            )
        if self.groups is not None:
            if not self.groups:
                raise ValueError("@groups: give at least one group, or leave groups out")
            if self.retention_interval:
                if not any(g.type in ("mamba", "sliding_window") for g in self.groups):
                    raise ValueError(
                        "@retention_interval: a positive retention interval needs a mamba or sliding_window group"
                    )
                sizes = {g.block_size or self.block_size for g in self.groups}
                lcm = math.lcm(*sizes)
                if self.retention_interval % lcm:
                    why = " (the scheduler block size, the LCM of the group block sizes)" if len(sizes) > 1 else ""
                    raise ValueError(
                        f"@retention_interval: {self.retention_interval} is not a multiple of the block size {lcm}{why}"
                    )
        return self


# --------------------------------------------------------------------------- scheduler


class SchedulerSection(_Strict):
    max_num_seqs: PositiveInt | None = None
    max_num_batched_tokens: PositiveInt | None = None
    max_model_len: PositiveInt | None = None
    long_prefill_token_threshold: NonNegativeInt = 0
    policy: Literal["fcfs", "priority"] = "fcfs"
    prefix_policy: str = Field(default="pr48425", min_length=1)
    watermark: float = Field(default=0.0, ge=0.0, lt=1.0, allow_inf_nan=False)
    # vLLM 0.34 (``vllm_version: "0.34"``; ``None`` until the scenario's release fills them in, and always
    # under 0.33, which has none of them). docs/admission.md.
    #: Cache-aware admission: within the first N waiting requests, those with a deeper cached prefix go first.
    cache_aware_admission_window: NonNegativeInt | None = None
    #: KV-cache usage at or above which the window applies.
    cache_aware_admission_threshold: Annotated[float, Field(ge=0.0, le=1.0, allow_inf_nan=False)] | None = None
    #: Cap on requests holding blocks for an async connector load; ``None``: no cap (and no early loads).
    max_num_inflight_kv_loads: PositiveInt | None = None
    #: What-if (not vLLM 0.33/0.34): vLLM 0.22.1's assertion that no external tokens reach the Mamba
    #: block-aligned split (vLLM #45407); ``verify`` refuses it. docs/pathologies.md §6.
    assert_no_external_kv_in_mamba_split: StrictBool = False


# --------------------------------------------------------------------------- connector


class ConnectorSection(BaseModel):
    """``type`` plus the connector's own keys (kept as extra fields; the connector validates them)."""

    model_config = ConfigDict(extra="allow", defer_build=True)
    type: str = Field(default="none", min_length=1)

    def options(self) -> dict[str, Any]:
        """The connector-specific keys."""
        return dict(self.model_extra or {})


# --------------------------------------------------------------------------- actions


class EvictSpec(_Strict):
    """Drop the cache entries of ``blocks`` (indices into ``prefix_of``'s prompt blocks) in ``group``."""

    prefix_of: str = Field(min_length=1)
    group: Union[Literal["full_attention", "mamba", "sliding_window"], NonNegativeInt]
    blocks: list[NonNegativeInt] = Field(min_length=1)


class ConnectorFault(BaseModel):
    """Fault options; their keys belong to the connector's fault wrapper."""

    model_config = ConfigDict(extra="allow", defer_build=True)


class ActionSpec(_Strict):
    """One intervention just before step ``at`` (``clock: steps``) or at ``at`` seconds (``clock: time``)."""

    at: NonNegativeFloat
    evict: EvictSpec | None = None
    reset_prefix_cache: Literal[True] | None = None
    connector_fault: ConnectorFault | None = None

    @model_validator(mode="after")
    def _one_kind(self) -> "ActionSpec":
        kinds = [k for k in ("evict", "reset_prefix_cache", "connector_fault") if getattr(self, k) is not None]
        if len(kinds) != 1:
            raise ValueError(
                "@evict: an action needs exactly one of 'evict', 'reset_prefix_cache' or 'connector_fault'"
                + (f" (got {', '.join(kinds)})" if kinds else "")
            )
        return self


# --------------------------------------------------------------------------- slo, outputs


class SLOSection(_Strict):
    """Goodput thresholds: a request meets the SLO when every given bound holds."""

    ttft_s: PositiveFloat | None = None
    tpot_s: PositiveFloat | None = None

    @model_validator(mode="after")
    def _something(self) -> "SLOSection":
        if self.ttft_s is None and self.tpot_s is None:
            raise ValueError("@ttft_s: give ttft_s, tpot_s or both")
        return self


class OutputsSection(_Strict):
    tables_format: Literal["parquet", "csv"] = "parquet"
    schedule_table: StrictBool | None = None
    plots: StrictBool = True
    #: Add ``cache.ideal_hit_rate`` (an infinite cache's prefix-hit rate at the scheduler block size) to the summary.
    ideal_hit_rate: StrictBool = False


# --------------------------------------------------------------------------- scenario


def _batch_defaults(hardware: HardwarePreset | None) -> tuple[int, int]:
    """``(max_num_batched_tokens, max_num_seqs)`` as vLLM 0.33 picks them for ``vllm serve``.

    ``EngineArgs.get_batch_defaults``: >= 160 GiB: 16384 / 1024; >= 70 GiB and
    not an A100: 8192 / 1024; otherwise 2048 / 256. With no hardware, the
    ``SchedulerConfig`` class defaults 2048 / 128.
    """
    if hardware is None:
        return 2048, 128
    if hardware.memory_bytes >= 160 * GiB:
        return 16384, 1024
    if hardware.memory_bytes >= 70 * GiB and not hardware.name.startswith("a100"):
        return 8192, 1024
    return 2048, 256


#: Connector options that map request ids to values; every id must name a request of the workload.
CONNECTOR_ID_MAPS = ("matched_tokens", "holds", "load_async")


def check_connector_request_ids(options: dict[str, Any], request_ids: list[str]) -> None:
    """A typo in a connector's per-request map (``matched_tokens: {prob: 16}`` for ``probe``) would silently
    change the run; like an action's ``prefix_of``, each id must be a request of the workload."""
    known = set(request_ids)
    for key in CONNECTOR_ID_MAPS:
        table = options.get(key)
        if not isinstance(table, dict):
            continue
        for rid in table:
            if str(rid) not in known:
                raise ValueError(
                    f"@connector.{key}.{rid}: no request {str(rid)!r} in the workload"
                    f"{did_you_mean(str(rid), sorted(known))}"
                )


class Scenario(_Strict):
    name: str = Field(min_length=1)
    seed: Annotated[int, Field(ge=0, lt=2**63, strict=True)] = 0
    clock: Literal["steps", "time"] = "steps"
    #: The vLLM release whose semantics the run mirrors (sim.config.vllm_versions); YAML ``0.34`` reads as "0.34".
    vllm_version: Annotated[VllmVersion, BeforeValidator(normalize)] = NEWEST
    model: ModelSection | None = None
    hardware: HardwareSection | None = None
    cache: CacheSection = Field(default_factory=CacheSection)
    scheduler: SchedulerSection = Field(default_factory=SchedulerSection)
    connector: ConnectorSection = Field(default_factory=ConnectorSection)
    workload: WorkloadSpec
    actions: list[ActionSpec] = Field(default_factory=list)
    on_crash: Literal["stop", "record"] = "stop"
    slo: SLOSection | None = None
    outputs: OutputsSection = Field(default_factory=OutputsSection)
    check_invariants: StrictBool = False
    #: Several instances behind a router (:mod:`sim.config.cluster`); ``None``: one instance.
    cluster: ClusterSection | None = None

    @field_validator("name")
    @classmethod
    def _path_safe_name(cls, name: str) -> str:
        """The name is a folder name (``results/<name>``): one plain path component, printable, not hidden."""
        bad = next((c for c in name if c in "/\\\0" or not c.isprintable()), None)
        if bad is not None:
            raise ValueError(f"{name!r} contains {bad!r}; a name is one folder name (letters, digits, '-', '_', '.')")
        if name in (".", "..") or name.startswith((".", "-")) or name != name.strip() or len(name) > 128:
            raise ValueError(
                f"{name!r} cannot be a folder name (no leading '.' or '-', no surrounding spaces, "
                "at most 128 characters)"
            )
        return name

    @model_validator(mode="before")
    @classmethod
    def _version_block_size(cls, data: Any) -> Any:
        """``cache.block_size: null`` is vLLM's default block size of the scenario's release (16, or 64 from 0.34)."""
        if isinstance(data, dict) and isinstance(data.get("cache"), dict) and "block_size" in data["cache"]:
            if data["cache"]["block_size"] is None:
                version = normalize(data.get("vllm_version", NEWEST))
                if version in DEFAULT_BLOCK_SIZE:
                    data = {**data, "cache": {**data["cache"], "block_size": DEFAULT_BLOCK_SIZE[version]}}
        return data

    @model_validator(mode="after")
    def _resolve(self) -> "Scenario":
        self._check_version_keys()
        self._check_model_and_clock()
        self._fill_scheduler_defaults()
        self._check_retention()
        self._check_actions()
        if self.outputs.schedule_table is None:
            self.outputs.schedule_table = self.clock == "steps"
        self._check_kv_memory()
        self._check_cluster()
        return self

    # -- checks, in the order they run

    def _check_version_keys(self) -> None:
        """A key newer than the scenario's release is an error naming both; the release's defaults fill the rest.

        A newer key set to its default value (what older releases do: no reordering, no cap) is accepted for an
        older release and cleared, so a resolved scenario of the newer release runs under
        ``--set vllm_version=<older>``; any other value is refused."""
        for path, since in KEYS_SINCE.items():
            section, key = path.split(".")
            owner = getattr(self, section)
            if at_least(self.vllm_version, since):
                if getattr(owner, key) is None:
                    setattr(owner, key, KEY_DEFAULTS[path])
            elif getattr(owner, key) == KEY_DEFAULTS[path]:
                setattr(owner, key, None)
            elif getattr(owner, key) is not None:
                raise ValueError(
                    f"@{path}: exists from vLLM {since} on; this scenario is for vLLM {self.vllm_version} "
                    f'(vllm_version: "{self.vllm_version}"; set vllm_version: "{since}" to use it)'
                )

    def _check_cluster(self) -> None:
        if self.cluster is None:
            return
        if self.actions:
            raise ValueError(
                "@cluster: scripted actions act on one engine's cache; a cluster scenario takes none "
                "(remove actions, or run the instance alone)"
            )

    def _check_model_and_clock(self) -> None:
        if self.model is None and self.cache.groups is None:
            raise ValueError("@model: give a model (a preset or explicit layers) or cache.groups")
        if self.clock == "time":
            if self.model is None or self.model.preset is None:
                raise ValueError(
                    f"@model: clock: time needs a model preset for the step-time model (valid: {', '.join(MODEL_PRESETS)})"
                )
            if self.hardware is None:
                raise ValueError(
                    f"@hardware: clock: time needs a hardware preset (valid: {', '.join(HARDWARE_PRESETS)})"
                )

    def _fill_scheduler_defaults(self) -> None:
        s = self.scheduler
        tokens, seqs = _batch_defaults(self.hardware.preset_obj() if self.hardware else None)
        if s.max_num_batched_tokens is None:
            s.max_num_batched_tokens = tokens
        if s.max_num_seqs is None:
            s.max_num_seqs = seqs
        if s.max_model_len is None:
            preset = self.model.preset_obj if self.model else None
            s.max_model_len = preset.max_model_len if preset else EXPLICIT_GROUPS_MAX_MODEL_LEN

    def _check_retention(self) -> None:
        n = self.cache.retention_interval
        if not n or self.cache.groups is not None or self.model is None:
            return
        shapes = self.model.layer_shapes()
        sparse = any(isinstance(layer, MambaLayerShape) or layer.window is not None for layer in shapes)
        if not sparse:
            raise ValueError(
                "@cache.retention_interval: a positive retention interval needs Mamba or sliding-window layers "
                f"(model {self.model.preset or 'layers'} has none)"
            )
        if not any(isinstance(layer, MambaLayerShape) for layer in shapes) and n % self.cache.block_size:
            raise ValueError(
                f"@cache.retention_interval: {n} is not a multiple of the block size {self.cache.block_size}"
            )

    def _check_actions(self) -> None:
        request_ids = [r.id for r in self.workload.requests] if self.workload.requests is not None else None
        if request_ids is not None:
            check_connector_request_ids(self.connector.options(), request_ids)
        groups = self.cache.groups
        for i, action in enumerate(self.actions):
            if self.clock == "steps" and action.at != int(action.at):
                raise ValueError(f"@actions.{i}.at: with clock: steps, 'at' is a step number (got {action.at})")
            ev = action.evict
            if ev is None:
                continue
            if request_ids is not None and ev.prefix_of not in request_ids:
                raise ValueError(
                    f"@actions.{i}.evict.prefix_of: no request {ev.prefix_of!r} in the workload"
                    f"{did_you_mean(ev.prefix_of, request_ids)}"
                )
            if groups is not None:
                if isinstance(ev.group, int) and ev.group >= len(groups):
                    raise ValueError(
                        f"@actions.{i}.evict.group: group index {ev.group} out of range (valid: 0..{len(groups) - 1})"
                    )
                if isinstance(ev.group, str) and all(g.type != ev.group for g in groups):
                    raise ValueError(
                        f"@actions.{i}.evict.group: no {ev.group} group in cache.groups "
                        f"(valid: {', '.join(sorted({g.type for g in groups}))})"
                    )

    def _check_kv_memory(self) -> None:
        if self.cache.num_blocks is not None or self.cache.kv_memory_gb is not None:
            return
        if self.hardware is None or self.model is None or self.model.preset is None:
            raise ValueError(
                "@cache.num_blocks: give cache.num_blocks or cache.kv_memory_gb, or a model preset and a hardware "
                "section to derive the KV memory from"
            )
        try:
            self.kv_memory_bytes()
        except ValueError as exc:
            raise ValueError(f"@hardware.preset: {exc}; give cache.num_blocks or cache.kv_memory_gb") from None

    # -- derived values for the builder

    def model_shape(self) -> ModelShape | None:
        """The model's cache layout (``None`` with only explicit groups); GDN checkpoints follow the hardware."""
        if self.model is None:
            return None
        preset = self.model.preset_obj
        if preset is not None:
            shape = preset.shape_for(self.hardware.preset_obj()) if self.hardware else preset.shape
            max_len = self.scheduler.max_model_len
            if max_len is not None and shape.max_model_len != max_len:
                shape = replace(shape, max_model_len=max_len)
            return shape
        assert self.scheduler.max_model_len is not None
        return ModelShape("layers", self.model.layer_shapes(), self.scheduler.max_model_len)

    def kv_memory_bytes(self) -> int | None:
        """KV-cache bytes: ``kv_memory_gb`` GiB, else the hardware-derived budget; ``None`` when ``num_blocks`` rules."""
        if self.cache.num_blocks is not None:
            return None
        if self.cache.kv_memory_gb is not None:
            return int(self.cache.kv_memory_gb * GiB)
        assert self.hardware is not None and self.model is not None and self.model.preset_obj is not None
        s = self.scheduler
        assert s.max_num_batched_tokens is not None and s.max_num_seqs is not None
        return kv_memory_budget(
            self.model.preset_obj,
            self.hardware.preset_obj(),
            gpu_memory_utilization=self.hardware.gpu_memory_utilization,
            max_num_batched_tokens=s.max_num_batched_tokens,
            max_num_seqs=s.max_num_seqs,
        )


__all__ = [
    "ActionSpec",
    "AttentionLayerSpec",
    "CacheSection",
    "ConnectorFault",
    "ConnectorSection",
    "EvictSpec",
    "FullAttentionGroup",
    "HardwareOverrides",
    "HardwareSection",
    "MambaGroup",
    "MambaLayerSpec",
    "ModelSection",
    "OutputsSection",
    "SLOSection",
    "Scenario",
    "SchedulerSection",
    "SlidingWindowGroup",
]
