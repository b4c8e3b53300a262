"""KV-cache specs, groups and the pool size, derived as vLLM 0.33 derives them.

Sources: ``vllm/v1/kv_cache_interface.py`` (specs), ``kv_cache_planning.py``
(``get_kv_cache_groups``, ``unify_kv_cache_spec_page_size``,
``_get_kv_cache_groups_uniform_page_size``, ``get_kv_cache_config_from_groups``),
``kv_cache_utils.resolve_kv_cache_block_sizes``, ``Platform._align_hybrid_block_size``,
``MambaModelConfig.verify_and_update_config`` and the coordinator's retention
validation.

Two builders:

* :func:`kv_cache_config_from_model`: a :class:`~sim.core.kv.shapes.ModelShape` →
  grouping, page-size unification (hybrid attention block size raised so one
  attention page holds a Mamba page; Mamba pages padded), ``num_blocks`` from a
  memory budget.
* :func:`kv_cache_config_from_groups`: an explicit group layout from a scenario
  (docs/design.md §7): no page-size unification, every group uses ``block_size``
  unless its item gives its own ``block_size``, no byte sizes
  (``page_size_bytes`` is ``None``).

Assumptions we make for the backend (vLLM asks the attention backend): the
FlashAttention kernel block alignment ``MultipleOf(16)``, the layer-outer
default layout (so no block-outermost packing), no KV quantisation.
"""

from __future__ import annotations

import math
from collections import defaultdict
from dataclasses import dataclass
from typing import Literal, Mapping, Sequence, Union

from sim.core.kv.shapes import AttentionLayerShape, MambaLayerShape, ModelShape

#: The attention type of a KV-cache group.
GroupKind = Literal["full_attention", "sliding_window", "mamba"]
MambaCacheMode = Literal["align", "none"]

#: Smallest kernel block of the assumed attention backend (FlashAttention: MultipleOf(16)).
KERNEL_BLOCK_ALIGNMENT = 16


def cdiv(a: int, b: int) -> int:
    return -(-a // b)


def prefill_checkpoint_position(num_tokens: int, alignment: int) -> int:
    """vLLM ``get_mamba_prefill_checkpoint_position`` (no EAGLE, no hash lookahead): the last
    ``alignment`` boundary strictly before the final token, whose state a resend can hit."""
    return max((num_tokens - 1) // alignment * alignment, 0)


def prefill_checkpoint_valid(
    query_start: int, query_end: int, checkpoint_position: int, hash_block_size: int, mamba_block_size: int
) -> bool:
    """vLLM ``is_mamba_prefill_checkpoint_valid`` for layers that export a state at any token
    (checkpoint alignment 1: MambaMixer2, GDN): the chunk ``[query_start, query_end)`` starts on a
    hash boundary, spans a later state column than its initial state, and contains the position."""
    initial_state_col = (query_start - 1) // mamba_block_size
    checkpoint_col = cdiv(query_end, mamba_block_size) - 2
    return (
        query_start % hash_block_size == 0
        and checkpoint_col > initial_state_col
        and query_start + hash_block_size <= checkpoint_position
        and query_start < checkpoint_position < query_end
    )


@dataclass(frozen=True, slots=True)
class FullAttentionSpec:
    """Every token of the sequence keeps its KV; one block per ``block_size`` tokens."""

    block_size: int
    page_size_bytes: int | None = None

    @property
    def kind(self) -> GroupKind:
        return "full_attention"

    def max_blocks_per_request(self, max_model_len: int, max_in_flight_tokens: int) -> int:
        """Blocks one request may hold (vLLM ``max_memory_usage_bytes`` / page): ``cdiv(max_model_len, B)``."""
        return cdiv(max_model_len, self.block_size)


@dataclass(frozen=True, slots=True)
class SlidingWindowSpec:
    """Only the last ``window`` tokens are attended; older blocks are freed."""

    block_size: int
    window: int
    page_size_bytes: int | None = None

    @property
    def kind(self) -> GroupKind:
        return "sliding_window"

    @property
    def blocks_for_hit(self) -> int:
        """Contiguous cached blocks a hit needs: ``cdiv(window - 1, block_size)`` (vLLM's lookup rule)."""
        return cdiv(self.window - 1, self.block_size)

    def max_admission_blocks_per_request(self, max_in_flight_tokens: int, max_model_len: int) -> int:
        """vLLM ``SlidingWindowSpec.max_admission_blocks_per_request``: window + in-flight, +1 for misalignment."""
        num_tokens = min(self.window - 1 + max_in_flight_tokens, max_model_len)
        return cdiv(num_tokens, self.block_size) + 1

    def max_blocks_per_request(self, max_model_len: int, max_in_flight_tokens: int) -> int:
        """Blocks one request may hold (vLLM ``max_memory_usage_bytes`` / page): the admission cap."""
        return self.max_admission_blocks_per_request(max_in_flight_tokens, max_model_len)


@dataclass(frozen=True, slots=True)
class MambaSpec:
    """A recurrent state per request. ``align`` caches states at block boundaries;
    ``none`` keeps one block (of ``max_model_len`` tokens) per request.

    ``prefill_checkpoints``: the layers can export the block-boundary state from
    inside a prefill chunk into a reserved block (vLLM
    ``num_prefill_checkpoint_blocks = 1``, alignment 1), so the final chunk is
    not split.
    """

    block_size: int
    mamba_cache_mode: MambaCacheMode = "align"
    prefill_checkpoints: bool = False
    page_size_bytes: int | None = None

    @property
    def kind(self) -> GroupKind:
        return "mamba"

    def max_blocks_per_request(self, max_model_len: int, max_in_flight_tokens: int) -> int:
        """Blocks one request may hold (vLLM ``max_memory_usage_bytes`` / page): in ``align``
        mode 2 (+1 prefill checkpoint block), else 1 (no speculative blocks modelled)."""
        if self.mamba_cache_mode == "align":
            return 2 + int(self.prefill_checkpoints)
        return 1


KVCacheSpec = Union[FullAttentionSpec, SlidingWindowSpec, MambaSpec]


@dataclass(frozen=True, slots=True)
class KVCacheGroupSpec:
    """Layers sharing one block table (vLLM ``KVCacheGroupSpec``); ``layer_ids`` index the model's layers."""

    spec: KVCacheSpec
    layer_ids: tuple[int, ...]


@dataclass(frozen=True, slots=True)
class KVCacheConfig:
    """Everything the cache core needs to know about the layout.

    ``scheduler_block_size`` is the LCM of the group block sizes (hits and
    Mamba chunk splits align to it); ``hash_block_size`` the GCD (the
    granularity of ``Request.block_hashes``), or the scheduler block size when
    a Mamba group is not in ``align`` mode or caching is off.
    ``retention_interval``: ``None`` dense, ``0`` only replay/junction
    boundaries, ``N`` one per ``N`` tokens (Mamba and sliding-window groups only).
    """

    num_blocks: int
    groups: tuple[KVCacheGroupSpec, ...]
    scheduler_block_size: int
    hash_block_size: int
    retention_interval: int | None
    enable_prefix_caching: bool
    max_model_len: int
    bytes_per_block: int | None = None

    @property
    def block_sizes(self) -> tuple[int, ...]:
        return tuple(g.spec.block_size for g in self.groups)

    @property
    def has_mamba_layers(self) -> bool:
        return any(isinstance(g.spec, MambaSpec) for g in self.groups)

    @property
    def needs_mamba_block_aligned_split(self) -> bool:
        """Align-mode Mamba with caching: prefill chunks end on block boundaries."""
        return self.enable_prefix_caching and any(
            isinstance(g.spec, MambaSpec) and g.spec.mamba_cache_mode == "align" for g in self.groups
        )

    @property
    def partial_hash_hits_enabled(self) -> bool:
        """vLLM ``partial_hash_hits_enabled`` (no DCP): an align-mode Mamba group
        whose block is larger than the hash block switches on fine-grained
        (hash-block) prefix hits, unless some other group's manager cannot look
        up below its own block (sliding window) and that block differs from the
        hash block. Needs prefix caching and several groups."""
        if not self.enable_prefix_caching or len(self.groups) <= 1:
            return False
        hbs = self.hash_block_size
        if not any(
            isinstance(g.spec, MambaSpec) and g.spec.mamba_cache_mode == "align" and g.spec.block_size > hbs
            for g in self.groups
        ):
            return False
        return not any(isinstance(g.spec, SlidingWindowSpec) and g.spec.block_size != hbs for g in self.groups)

    @property
    def mamba_prefill_checkpoints(self) -> bool:
        """Every Mamba group can export prefill checkpoints (vLLM needs all of them)."""
        mamba = [g.spec for g in self.groups if isinstance(g.spec, MambaSpec)]
        return bool(mamba) and all(s.prefill_checkpoints for s in mamba)


# ------------------------------------------------------------------ validation
def _resolve_mamba_mode(mode: str | None, enable_prefix_caching: bool) -> MambaCacheMode:
    """vLLM ``MambaModelConfig``: caching on → ``align``, off → ``none``."""
    wanted: MambaCacheMode = "align" if enable_prefix_caching else "none"
    if mode is None:
        return wanted
    if mode not in ("align", "none"):
        raise ValueError(f"mamba_cache_mode must be 'align' or 'none', got {mode!r}")
    if mode != wanted:
        raise ValueError(
            f"mamba_cache_mode={mode!r} contradicts enable_prefix_caching={enable_prefix_caching}: "
            "vLLM uses 'align' exactly when prefix caching is on and 'none' when it is off"
        )
    return mode


def _validate_retention(
    retention_interval: int | None, scheduler_block_size: int, groups: Sequence[KVCacheGroupSpec]
) -> None:
    """vLLM ``_validate_prefix_cache_retention_interval``."""
    if retention_interval is None:
        return
    if not isinstance(retention_interval, int) or isinstance(retention_interval, bool):
        raise ValueError(f"retention_interval must be null, 0 or a token count, got {retention_interval!r}")
    if not any(isinstance(g.spec, (SlidingWindowSpec, MambaSpec)) for g in groups):
        if retention_interval == 0:
            return
        raise ValueError(
            f"retention_interval={retention_interval} is set but the model has no sliding-window or "
            "Mamba group, so retention has no effect; set it to 0 or null"
        )
    if retention_interval < 0 or retention_interval % scheduler_block_size:
        raise ValueError(
            f"retention_interval ({retention_interval}) must be non-negative and a multiple of the "
            f"scheduler block size ({scheduler_block_size})"
        )


def _block_sizes(groups: Sequence[KVCacheGroupSpec], enable_prefix_caching: bool) -> tuple[int, int]:
    """vLLM ``resolve_kv_cache_block_sizes`` (no ``prefix_match_unit``, no DCP)."""
    sizes = [g.spec.block_size for g in groups]
    if len(sizes) <= 1:
        return sizes[0], sizes[0]
    scheduler = math.lcm(*sizes)
    if not enable_prefix_caching:
        return scheduler, scheduler
    if any(isinstance(g.spec, MambaSpec) and g.spec.mamba_cache_mode != "align" for g in groups):
        return scheduler, scheduler
    return scheduler, math.gcd(*sizes)


def _finish(
    groups: list[KVCacheGroupSpec],
    *,
    num_blocks: int,
    retention_interval: int | None,
    enable_prefix_caching: bool,
    max_model_len: int,
    bytes_per_block: int | None,
) -> KVCacheConfig:
    if not groups:
        raise ValueError("a KV-cache layout needs at least one group")
    if not isinstance(num_blocks, int) or num_blocks < 2:
        raise ValueError(f"num_blocks must be an integer >= 2 (block 0 is the null block), got {num_blocks!r}")
    scheduler_bs, hash_bs = _block_sizes(groups, enable_prefix_caching)
    _validate_retention(retention_interval, scheduler_bs, groups)
    config = KVCacheConfig(
        num_blocks=num_blocks,
        groups=tuple(groups),
        scheduler_block_size=scheduler_bs,
        hash_block_size=hash_bs,
        retention_interval=retention_interval,
        enable_prefix_caching=enable_prefix_caching,
        max_model_len=max_model_len,
        bytes_per_block=bytes_per_block,
    )
    check_modelled_layout(config)
    return config


def check_modelled_layout(config: KVCacheConfig) -> None:
    """Reject layouts for which vLLM would turn on fine-grained partial prefix
    hits (hits on hash-block boundaries inside a Mamba block, with copy-on-write
    of the partial tail): the simulator does not model them, so it would decide
    differently. Every other mix of block sizes is modelled."""
    if config.partial_hash_hits_enabled:
        sizes = ", ".join(f"{g.spec.kind}={g.spec.block_size}" for g in config.groups)
        raise ValueError(
            f"cache.groups: block sizes ({sizes}) give hash block size {config.hash_block_size} below the Mamba "
            "block size, for which vLLM 0.33 enables fine-grained partial prefix hits; these are not modelled. "
            f"Give every Mamba group block_size {config.hash_block_size} (the GCD of the group block sizes), or "
            "add a sliding_window group whose block size differs from the GCD (vLLM then keeps hits on "
            "scheduler-block boundaries)"
        )


# ----------------------------------------------------------- explicit groups
GroupItem = Union[str, Mapping[str, object]]


def _parse_group(
    item: GroupItem, index: int, block_size: int, mamba_mode: MambaCacheMode, max_model_len: int
) -> KVCacheSpec:
    where = f"cache.groups[{index}]"
    if isinstance(item, str):
        item = {"type": item}
    if not isinstance(item, Mapping):
        raise ValueError(f"{where}: expected a type name or a mapping, got {item!r}")
    kind = item.get("type")
    allowed = {
        "full_attention": {"type", "block_size"},
        "sliding_window": {"type", "window", "block_size"},
        "mamba": {"type", "prefill_checkpoints", "block_size"},
    }
    if kind not in allowed:
        raise ValueError(f"{where}: type must be one of full_attention, sliding_window, mamba; got {kind!r}")
    extra = set(item) - allowed[kind]
    if extra:
        raise ValueError(f"{where}: unknown key(s) {sorted(extra)} for type {kind}; valid: {sorted(allowed[kind])}")
    own = item.get("block_size")
    if own is not None:
        if not isinstance(own, int) or isinstance(own, bool) or own < 1:
            raise ValueError(f"{where}.block_size: must be a positive integer, got {own!r}")
        if kind == "mamba" and mamba_mode != "align":
            raise ValueError(
                f"{where}.block_size: a Mamba group without prefix caching ('none' mode) always uses "
                f"max_model_len ({max_model_len}) as its block size; leave block_size out"
            )
        block_size = own
    if kind == "full_attention":
        return FullAttentionSpec(block_size)
    if kind == "sliding_window":
        window = item.get("window")
        if not isinstance(window, int) or isinstance(window, bool) or window < 1:
            raise ValueError(f"{where}: sliding_window needs a positive integer 'window', got {window!r}")
        return SlidingWindowSpec(block_size, window)
    ckpt = item.get("prefill_checkpoints", False)
    if not isinstance(ckpt, bool):
        raise ValueError(f"{where}: prefill_checkpoints must be true or false, got {ckpt!r}")
    mamba_bs = block_size if mamba_mode == "align" else max_model_len
    return MambaSpec(mamba_bs, mamba_mode, ckpt)


def kv_cache_config_from_groups(
    groups: Sequence[GroupItem],
    *,
    block_size: int,
    num_blocks: int,
    enable_prefix_caching: bool = True,
    mamba_cache_mode: MambaCacheMode | None = None,
    retention_interval: int | None = 0,
    max_model_len: int = 8192,
) -> KVCacheConfig:
    """A layout given group by group (as vLLM's unit tests build ``KVCacheConfig``).

    Every group uses ``block_size`` (no page-size unification) unless its item
    sets its own ``block_size``; a Mamba group in ``none`` mode uses
    ``max_model_len`` as vLLM does. Each item is ``"full_attention"``,
    ``"mamba"``, ``{"type": "sliding_window", "window": W}`` or
    ``{"type": "mamba", "prefill_checkpoints": bool}``; any mapping may add
    ``"block_size": B`` (e.g. ``{"type": "mamba", "block_size": 32}``). With
    differing sizes the scheduler block size is their LCM and the hash block
    size their GCD (:func:`_block_sizes`); layouts for which vLLM would enable
    fine-grained partial hits are rejected (:func:`check_modelled_layout`).
    """
    if not isinstance(block_size, int) or block_size < 1:
        raise ValueError(f"block_size must be a positive integer, got {block_size!r}")
    if not groups:
        raise ValueError("cache.groups must list at least one group")
    mode = _resolve_mamba_mode(mamba_cache_mode, enable_prefix_caching)
    specs = [_parse_group(item, i, block_size, mode, max_model_len) for i, item in enumerate(groups)]
    return _finish(
        [KVCacheGroupSpec(spec, (i,)) for i, spec in enumerate(specs)],
        num_blocks=num_blocks,
        retention_interval=retention_interval,
        enable_prefix_caching=enable_prefix_caching,
        max_model_len=max_model_len,
        bytes_per_block=None,
    )


# ------------------------------------------------------------- from a model
def align_hybrid_block_size(block_size: int, attn_bytes_per_token: int, mamba_page_bytes: int) -> int:
    """vLLM ``Platform._align_hybrid_block_size``: smallest kernel-aligned attention
    block whose page holds one Mamba page (never below ``block_size``).

    ``K = max(16, block_size)`` (lcm'd with the checkpoint alignment, 1 for
    every Mamba mixer we model); ``B = K * cdiv(mamba_page, K * attn_page_per_token)``
    rounded up to the backend alignment 16.
    """
    k = max(KERNEL_BLOCK_ALIGNMENT, block_size)
    attn_bs = k * cdiv(mamba_page_bytes, k * attn_bytes_per_token)
    attn_bs = KERNEL_BLOCK_ALIGNMENT * cdiv(attn_bs, KERNEL_BLOCK_ALIGNMENT)
    return max(block_size, attn_bs)


def _group_layers(layer_specs: dict[int, KVCacheSpec]) -> list[KVCacheGroupSpec]:
    """vLLM ``_get_kv_cache_groups_uniform_page_size``: bucket equal specs, cut
    buckets into groups of equal size (the smallest bucket, or the largest if
    ``max < 1.5 * min``), assigning ``layers[i::num_groups]`` to group ``i``."""
    buckets: dict[KVCacheSpec, list[int]] = defaultdict(list)
    for layer_id, spec in layer_specs.items():
        buckets[spec].append(layer_id)
    sizes = [len(v) for v in buckets.values()]
    group_size = min(sizes)
    if max(sizes) < group_size * 1.5:
        group_size = max(sizes)
    groups: list[KVCacheGroupSpec] = []
    for spec, layers in buckets.items():
        n = cdiv(len(layers), group_size)
        for i in range(n):
            groups.append(KVCacheGroupSpec(spec, tuple(layers[i::n])))
    return groups


def kv_cache_config_from_model(
    model: ModelShape,
    *,
    block_size: int = 16,
    enable_prefix_caching: bool = True,
    mamba_cache_mode: MambaCacheMode | None = None,
    retention_interval: int | None = 0,
    kv_memory_bytes: int | None = None,
    num_blocks: int | None = None,
    max_model_len: int | None = None,
) -> KVCacheConfig:
    """Groups, block sizes, page sizes and ``num_blocks`` of a model, as vLLM derives them.

    ``num_blocks`` (vLLM ``num_gpu_blocks_override``) wins over
    ``kv_memory_bytes // bytes_per_block``; one of them is required.
    ``bytes_per_block`` is the largest group's sum of layer pages.
    """
    if not isinstance(block_size, int) or block_size < 1:
        raise ValueError(f"block_size must be a positive integer, got {block_size!r}")
    max_len = model.max_model_len if max_model_len is None else max_model_len
    attn = [layer for layer in model.layers if isinstance(layer, AttentionLayerShape)]
    mamba = [layer for layer in model.layers if isinstance(layer, MambaLayerShape)]
    if not attn and not mamba:
        raise ValueError(f"model {model.name!r} has no attention or Mamba layers")
    mode = _resolve_mamba_mode(mamba_cache_mode, enable_prefix_caching) if mamba else "none"

    attn_block = block_size
    mamba_page_padded: int | None = None
    if attn and mamba:
        per_token = {layer.bytes_per_token for layer in attn}
        if len(per_token) != 1:
            raise ValueError(
                f"model {model.name!r}: hybrid models need one attention KV size per token, got {sorted(per_token)}"
            )
        attn_per_token = per_token.pop()
        mamba_page = max(layer.state_bytes for layer in mamba)
        attn_block = align_hybrid_block_size(block_size, attn_per_token, mamba_page)
        mamba_page_padded = attn_block * attn_per_token
    mamba_block = attn_block if mode == "align" else max_len

    layer_specs: dict[int, KVCacheSpec] = {}
    for i, layer in enumerate(model.layers):
        if isinstance(layer, AttentionLayerShape):
            page = attn_block * layer.bytes_per_token
            if layer.window is None:
                layer_specs[i] = FullAttentionSpec(attn_block, page)
            else:
                layer_specs[i] = SlidingWindowSpec(attn_block, layer.window, page)
        else:
            page = mamba_page_padded if mamba_page_padded is not None else layer.state_bytes
            layer_specs[i] = MambaSpec(mamba_block, mode, layer.prefill_checkpoints, page)
    distinct = set(layer_specs.values())
    if len(distinct) == 1:
        groups = [KVCacheGroupSpec(distinct.pop(), tuple(layer_specs))]
    elif _uniform_type(distinct):
        # vLLM ``UniformTypeKVCacheSpecs``: every layer needs the same token
        # slots (one attention type, different head sizes) -> one group.
        groups = [KVCacheGroupSpec(layer_specs[0], tuple(layer_specs))]
    else:
        layer_specs = _unify_page_sizes(layer_specs)
        groups = _group_layers(layer_specs)

    bytes_per_block = max(sum(layer_specs[i].page_size_bytes or 0 for i in g.layer_ids) for g in groups)
    if num_blocks is None:
        if kv_memory_bytes is None:
            raise ValueError("give either num_blocks or kv_memory_bytes to size the block pool")
        num_blocks = kv_memory_bytes // bytes_per_block
        if num_blocks < 2:
            raise ValueError(
                f"kv_memory_bytes={kv_memory_bytes} holds {num_blocks} blocks of {bytes_per_block} bytes; "
                "at least 2 are needed (block 0 is the null block)"
            )
    return _finish(
        groups,
        num_blocks=num_blocks,
        retention_interval=retention_interval,
        enable_prefix_caching=enable_prefix_caching,
        max_model_len=max_len,
        bytes_per_block=bytes_per_block,
    )


def _uniform_type(specs: set[KVCacheSpec]) -> bool:
    if all(isinstance(s, FullAttentionSpec) for s in specs):
        return True
    return all(isinstance(s, SlidingWindowSpec) for s in specs) and len({s.window for s in specs}) == 1  # type: ignore[union-attr]


def _unify_page_sizes(layer_specs: dict[int, KVCacheSpec]) -> dict[int, KVCacheSpec]:
    """vLLM ``unify_kv_cache_spec_page_size``: smaller attention pages grow their
    block size by the page ratio (or are padded if it does not divide);
    Mamba pages are padded."""
    pages = {s.page_size_bytes for s in layer_specs.values()}
    if len(pages) <= 1:
        return layer_specs
    top = max(p or 0 for p in pages)
    out: dict[int, KVCacheSpec] = {}
    for i, spec in layer_specs.items():
        page = spec.page_size_bytes or 0
        if page == top:
            out[i] = spec
        elif isinstance(spec, MambaSpec):
            out[i] = MambaSpec(spec.block_size, spec.mamba_cache_mode, spec.prefill_checkpoints, top)
        elif top % page == 0:
            ratio = top // page
            if isinstance(spec, SlidingWindowSpec):
                out[i] = SlidingWindowSpec(spec.block_size * ratio, spec.window, top)
            else:
                out[i] = FullAttentionSpec(spec.block_size * ratio, top)
        elif isinstance(spec, SlidingWindowSpec):
            out[i] = SlidingWindowSpec(spec.block_size, spec.window, top)
        else:
            out[i] = FullAttentionSpec(spec.block_size, top)
    return out
