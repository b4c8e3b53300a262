"""Per-layer cache shapes of a model: the input to KV-cache spec derivation.

A model preset (``sim.config.presets``) describes its layers with these
records; ``sim.core.kv.specs`` turns them into KV-cache specs, groups and page
sizes the way vLLM 0.33 does (``get_kv_cache_groups``,
``unify_kv_cache_spec_page_size``, ``Platform._align_hybrid_block_size``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal, Union


@dataclass(frozen=True, slots=True)
class AttentionLayerShape:
    """A self-attention layer's KV per token: ``num_kv_heads * (head_size + head_size_v) * dtype_bytes``.

    ``window`` is set for sliding-window layers (tokens), ``None`` for full attention.
    """

    num_kv_heads: int
    head_size: int
    head_size_v: int | None = None
    dtype_bytes: int = 2
    window: int | None = None

    @property
    def kind(self) -> Literal["full_attention", "sliding_window"]:
        return "full_attention" if self.window is None else "sliding_window"

    @property
    def bytes_per_token(self) -> int:
        v = self.head_size if self.head_size_v is None else self.head_size_v
        return self.num_kv_heads * (self.head_size + v) * self.dtype_bytes


@dataclass(frozen=True, slots=True)
class MambaLayerShape:
    """A Mamba/SSM/linear-attention layer's recurrent state (one state per request).

    ``state_shapes`` are the per-request tensors (conv state, SSM state, …) and
    ``state_dtype_bytes`` their element sizes, as vLLM's ``MambaSpec.shapes`` /
    ``dtypes``. ``mixer`` names the layer family; ``prefill_checkpoints`` says
    whether the layer can write a block-boundary state from inside a prefill
    chunk into a reserved checkpoint block (vLLM ``num_prefill_checkpoint_blocks
    = 1``: Mamba2 mixers and GDN on some backends; Mamba1 cannot).
    """

    state_shapes: tuple[tuple[int, ...], ...]
    state_dtype_bytes: tuple[int, ...]
    mixer: Literal["mamba1", "mamba2", "gdn", "short_conv"] = "mamba2"
    prefill_checkpoints: bool = True

    @property
    def state_bytes(self) -> int:
        total = 0
        for shape, nbytes in zip(self.state_shapes, self.state_dtype_bytes, strict=True):
            n = 1
            for d in shape:
                n *= d
            total += n * nbytes
        return total


LayerShape = Union[AttentionLayerShape, MambaLayerShape]


@dataclass(frozen=True, slots=True)
class ModelShape:
    """The cache-relevant shape of a model: its layers in order, and its limits."""

    name: str
    layers: tuple[LayerShape, ...]
    max_model_len: int

    @property
    def has_mamba(self) -> bool:
        return any(isinstance(layer, MambaLayerShape) for layer in self.layers)
