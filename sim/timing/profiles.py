"""Read a GPU kernel profile in Vidur's CSV layout and build whole steps from it.

A profile directory holds ``mlp.csv`` (linear ops and small ops per token
count) and, optionally, ``attention.csv`` (FlashInfer/FlashAttention prefill
and decode per batch shape), as Vidur's profiler writes them under
``data/profiling/compute/<gpu>/<model>/``. Only the columns named here are read
(``time_stats.<op>.median`` in milliseconds, plus the shape columns), so a
column subset of Vidur's files also loads (a profile without
``attn_kv_cache_save``, as Vidur's FlashAttention backend writes, counts it as 0); rows with
``num_tensor_parallel_workers != 1`` are ignored (the model is TP 1); of rows
repeated for one shape (Vidur's token grid lists some sizes twice) the first is
used.

A profiled step is summed the way Vidur sums one: per-layer op medians times
the number of layers, plus the embedding, with no LM head, sampling or CPU
time (a kernel profile has none). By default the prefill ``attn_kv_cache_save``
is left out: in Vidur's public A100 profiles it grows at ~0.55 µs per token per
layer (~7 GB/s, 35x the per-token cost of the decode rows), which no KV-cache
write kernel takes, so we read it as an artefact of the profiler;
``include_prefill_kv_save=True`` keeps it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import pandas as pd

from sim.config.presets import ModelPreset, dense_transformer_preset

MLP_OPS = (
    "input_layernorm",
    "attn_pre_proj",
    "attn_rope",
    "attn_post_proj",
    "post_attention_layernorm",
    "mlp_up_proj",
    "mlp_act",
    "mlp_down_proj",
    "add",
)
MLP_SHAPE = ("n_head", "n_kv_head", "n_embd", "n_expanded_embd", "vocab_size", "use_gated_mlp", "num_tokens")
ATTN_OPS = ("attn_prefill", "attn_decode")
#: Newer Vidur profiles (its FlashAttention backend) have no KV-cache-save column: it counts as 0.
KV_SAVE = "attn_kv_cache_save"
ATTN_SHAPE = ("batch_size", "prefill_chunk_size", "kv_cache_size", "is_prefill")
#: Per-layer small ops in a Vidur layer: two norms, rotary, activation, two residual adds.
SMALL_OPS = ("input_layernorm", "attn_rope", "post_attention_layernorm", "mlp_act", "add", "add")


class ProfileError(ValueError):
    """A profile directory or file that cannot be used (the message names it)."""


def _col(op: str) -> str:
    return f"time_stats.{op}.median"


@dataclass(frozen=True)
class Profile:
    """One profile directory: the TP-1 rows of ``mlp.csv`` (indexed by ``num_tokens``) and ``attention.csv``."""

    path: Path
    mlp: pd.DataFrame
    attention: pd.DataFrame | None
    hidden: int
    heads: int
    kv_heads: int
    intermediate: int
    vocab: int
    gated: bool

    @property
    def token_counts(self) -> set[int]:
        return set(int(t) for t in self.mlp.index)

    def model(self, layers: int, name: str = "profile") -> ModelPreset:
        """A plain transformer with the profile's shapes and ``layers`` decoder layers (the CSVs do not say)."""
        return dense_transformer_preset(
            name,
            hf_repo="-",
            hidden=self.hidden,
            layers=layers,
            heads=self.heads,
            kv_heads=self.kv_heads,
            intermediate=self.intermediate,
            vocab=self.vocab,
            max_model_len=1 << 20,
            gated=self.gated,
        )


#: Bounds of a profile's model shape (a shape outside them is a broken file, not a model).
SHAPE_BOUNDS = {
    "n_embd": 1 << 17,
    "n_head": 1 << 12,
    "n_kv_head": 1 << 12,
    "n_expanded_embd": 1 << 20,
    "vocab_size": 1 << 24,
}
#: Token and batch counts of the profile's rows (integers, at most 2**24).
COUNT_COLUMNS = ("num_tokens", "batch_size", "prefill_chunk_size", "kv_cache_size")
#: Most decoder layers ``timing check|fit --layers`` accepts.
MAX_LAYERS = 4096


def _read_csv(path: Path, needed: tuple[str, ...]) -> pd.DataFrame:
    """A profile CSV read through :mod:`sim.inputfile` (a regular file within the ``csv_bytes`` limit), its
    needed columns present and its ``time_stats.*.median`` columns finite numbers >= 0."""
    import io

    from sim.inputfile import InputFileError, read_bytes

    try:
        df = pd.read_csv(io.BytesIO(read_bytes(path, "profile CSV", "csv_bytes")))
    except InputFileError as exc:
        raise ProfileError(str(exc)) from None
    except (ValueError, pd.errors.ParserError, pd.errors.EmptyDataError) as exc:
        raise ProfileError(f"{path}: cannot read it as CSV ({type(exc).__name__})") from None
    missing = [c for c in needed if c not in df.columns]
    if missing:
        raise ProfileError(f"{path}: missing column(s) {', '.join(missing)} (Vidur's profile layout expected)")
    if "num_tensor_parallel_workers" in df.columns:
        df = df[df["num_tensor_parallel_workers"] == 1]
    if df.empty:
        raise ProfileError(f"{path}: no rows with num_tensor_parallel_workers == 1")
    for col in [*needed, _col(KV_SAVE)]:
        if col not in df.columns or (not col.endswith(".median") and col not in COUNT_COLUMNS):
            continue
        values = pd.to_numeric(df[col], errors="coerce")
        if col.endswith(".median"):  # NaN, inf, negative, text: not a median in milliseconds
            bad, valid = ~values.between(0, 1e9), "a finite time in milliseconds >= 0"
        else:
            bad, valid = ~(values.between(0, 1 << 24) & (values % 1 == 0)), f"an integer from 0 to {1 << 24}"
        if bad.any():
            row = int(bad.to_numpy().argmax())
            raise ProfileError(f"{path}: {col} (row {row + 1}): expected {valid}, got {str(df[col].iloc[row])[:24]!r}")
        df = df.assign(**{col: values if col.endswith(".median") else values.astype("int64")})
    return df


def _shape(path: Path, first: pd.Series, key: str) -> int:
    """The integer shape field ``key`` of a profile, within :data:`SHAPE_BOUNDS`."""
    raw = first[key]
    try:
        value = float(raw)
    except (TypeError, ValueError):
        value = float("nan")
    hi = SHAPE_BOUNDS[key]
    if not (value.is_integer() and 1 <= value <= hi):
        raise ProfileError(f"{path}: {key}: expected an integer from 1 to {hi}, got {str(raw)[:24]!r}")
    return int(value)


def check_layers(layers: int) -> int:
    """``--layers`` within 1 .. :data:`MAX_LAYERS` (a larger count is no model and overflows the pricing)."""
    if not 1 <= layers <= MAX_LAYERS:
        raise ProfileError(f"--layers: expected an integer from 1 to {MAX_LAYERS}, got {layers}")
    return layers


def load_profile(path: str | Path) -> Profile:
    """Load ``PATH/mlp.csv`` and, if present, ``PATH/attention.csv`` (raises :class:`ProfileError`)."""
    root = Path(path)
    if not root.is_dir():
        raise ProfileError(f"{root}: not a directory (expected a profile directory holding mlp.csv)")
    mlp_path = root / "mlp.csv"
    if not mlp_path.is_file():
        raise ProfileError(f"{root}: no mlp.csv (Vidur's layout: <dir>/mlp.csv and <dir>/attention.csv)")
    mlp = _read_csv(mlp_path, MLP_SHAPE + tuple(_col(op) for op in MLP_OPS + ("emb",)))
    mlp = mlp.groupby("num_tokens", sort=True).first()
    first = mlp.iloc[0]
    attention = None
    attn_path = root / "attention.csv"
    if attn_path.is_file():
        attention = _read_csv(attn_path, ATTN_SHAPE + tuple(_col(op) for op in ATTN_OPS))
        if _col(KV_SAVE) not in attention.columns:
            attention = attention.assign(**{_col(KV_SAVE): 0.0})
        attention = attention.assign(is_prefill=attention["is_prefill"].astype(str).str.lower() == "true")
        attention = attention.groupby(list(ATTN_SHAPE), sort=True).first().reset_index()
    shape = {key: _shape(mlp_path, first, key) for key in SHAPE_BOUNDS}
    if shape["n_embd"] % shape["n_head"] or shape["n_head"] % shape["n_kv_head"]:
        raise ProfileError(
            f"{mlp_path}: n_embd {shape['n_embd']}, n_head {shape['n_head']}, n_kv_head {shape['n_kv_head']}: "
            "n_head must divide n_embd and n_kv_head must divide n_head"
        )
    return Profile(
        path=root,
        mlp=mlp,
        attention=attention,
        hidden=shape["n_embd"],
        heads=shape["n_head"],
        kv_heads=shape["n_kv_head"],
        intermediate=shape["n_expanded_embd"],
        vocab=shape["vocab_size"],
        gated=str(first["use_gated_mlp"]).lower() == "true",
    )


@dataclass
class ProfiledStep:
    """One step built from profile rows: its batch ``[(new, context), ...]`` and the profiled seconds per term."""

    label: str
    regime: str
    batch: list[tuple[int, int]]
    parts: dict[str, float] = field(default_factory=dict)

    @property
    def seconds(self) -> float:
        return sum(self.parts.values())


def _ms(row: pd.Series, op: str) -> float:
    return float(row[_col(op)]) * 1e-3


def _linear_parts(profile: Profile, tokens: int, layers: int) -> dict[str, float]:
    """Per-step seconds of the linear and small ops at ``tokens`` rows (layers times the per-layer medians)."""
    row = profile.mlp.loc[tokens]
    return {
        "attn_proj": layers * (_ms(row, "attn_pre_proj") + _ms(row, "attn_post_proj")),
        "mlp": layers * (_ms(row, "mlp_up_proj") + _ms(row, "mlp_down_proj")),
        "small_ops": layers * sum(_ms(row, op) for op in SMALL_OPS) + _ms(row, "emb"),
    }


def profiled_steps(
    profile: Profile,
    layers: int,
    *,
    include_prefill_kv_save: bool = False,
    mixed_batches: tuple[int, ...] = (16, 64),
    mixed_max_chunk: int = 4096,
) -> list[ProfiledStep]:
    """Every step the profile can price whole (its linear rows exist at the step's token count).

    With ``attention.csv``: each prefill row (one chunk on its cached context),
    each decode row (``batch_size`` decodes at ``kv_cache_size`` context each)
    and, as mixed steps, each context-free prefill chunk up to
    ``mixed_max_chunk`` tokens paired with the decode rows of ``mixed_batches``
    requests. Without it: linear-only steps (``attn_*`` terms absent on both
    sides), one single-chunk prefill per profiled token count >= 512 and one
    decode batch per token count <= 256.
    """
    tokens = profile.token_counts
    steps: list[ProfiledStep] = []
    if profile.attention is None:
        for t in sorted(tokens):
            if t <= 256:
                steps.append(
                    ProfiledStep(
                        f"decode b={t} (linear only)", "decode", [(1, 0)] * t, _linear_parts(profile, t, layers)
                    )
                )
            if t >= 512:
                steps.append(
                    ProfiledStep(f"prefill {t} (linear only)", "prefill", [(t, 0)], _linear_parts(profile, t, layers))
                )
        return steps
    att = profile.attention
    prefills = att[att["is_prefill"] & (att["batch_size"] == 1)]
    decodes = att[~att["is_prefill"]]
    for _, row in prefills.iterrows():
        n, c = int(row["prefill_chunk_size"]), int(row["kv_cache_size"])
        if n not in tokens:
            continue
        parts = _linear_parts(profile, n, layers)
        parts["attn_prefill"] = layers * _ms(row, "attn_prefill")
        if include_prefill_kv_save:
            parts["small_ops"] += layers * _ms(row, KV_SAVE)
        steps.append(ProfiledStep(f"prefill {n} on {c}", "prefill", [(n, c)], parts))
    for _, row in decodes.iterrows():
        b, c = int(row["batch_size"]), int(row["kv_cache_size"])
        if b not in tokens:
            continue
        parts = _linear_parts(profile, b, layers)
        parts["attn_decode"] = layers * _ms(row, "attn_decode")
        parts["small_ops"] += layers * _ms(row, KV_SAVE)
        steps.append(ProfiledStep(f"decode b={b} at {c}", "decode", [(1, c)] * b, parts))
    for _, p in prefills[
        (prefills["kv_cache_size"] == 0) & (prefills["prefill_chunk_size"] <= mixed_max_chunk)
    ].iterrows():
        n = int(p["prefill_chunk_size"])
        for _, d in decodes[decodes["batch_size"].isin(mixed_batches)].iterrows():
            b, c = int(d["batch_size"]), int(d["kv_cache_size"])
            if n + b not in tokens:
                continue
            parts = _linear_parts(profile, n + b, layers)
            parts["attn_prefill"] = layers * _ms(p, "attn_prefill")
            parts["attn_decode"] = layers * _ms(d, "attn_decode")
            parts["small_ops"] += layers * _ms(d, KV_SAVE)
            if include_prefill_kv_save:
                parts["small_ops"] += layers * _ms(p, KV_SAVE)
            steps.append(ProfiledStep(f"mixed {n} + b={b} at {c}", "mixed", [(n, 0)] + [(1, c)] * b, parts))
    return steps
