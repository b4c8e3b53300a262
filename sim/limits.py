"""Resource limits on input, each with a clear error (documented in docs/limits.md).

A limit exists so that hostile or mistaken input fails in a second with a message instead of running out of
memory. Each is overridable by an environment variable ``HYBRIDSIM_MAX_<NAME>`` (upper-case), read when the
limit is checked, so a user who really means a 20-million-request workload can say so. Numeric ranges (times,
rates) are fixed: beyond them the arithmetic itself stops being meaningful.
"""

from __future__ import annotations

import os

DEFAULTS: dict[str, int] = {
    "yaml_bytes": 8 * 1024 * 1024,  # a scenario, sweep, grid or hardware-overrides file
    "line_bytes": 16 * 1024 * 1024,  # one line of a JSONL trace
    "csv_bytes": 64 * 1024 * 1024,  # a kernel-profile CSV or an empirical length table
    "json_bytes": 64 * 1024 * 1024,  # a bundle's summary.json, manifest.json, crash.json
    "yaml_depth": 64,  # nesting of mappings and lists
    "yaml_nodes": 500_000,  # values after alias expansion ("billion laughs")
    "requests": 2_000_000,  # requests in one workload (script, generator estimate, trace)
    "token_ids": 100_000_000,  # explicit token ids in one trace (Parquet: counted from its metadata)
    "num_blocks": 50_000_000,  # KV-cache blocks (the pool holds one object per block)
    "seeds": 10_000,  # seeds of one sweep
    "sweep_runs": 100_000,  # runs of one sweep (grid points x seeds)
}

#: Largest token count of one request or segment (prompt tokens, a segment's ``tokens`` and ``start``, output
#: length, ``max_tokens``, a connector's ``matched_tokens``): 16M tokens, far beyond any model's context.
MAX_TOKENS = 1 << 24
#: Largest integer any other count or size may take (``2**53``: exact as a float, so arithmetic on it stays exact).
MAX_INT = 1 << 53
#: Longest request id, content label, LoRA name or cache salt (characters; each must also be printable).
MAX_LABEL = 256
#: Largest time in seconds anywhere in a workload (arrivals, durations, windows): about 31 years.
MAX_TIME_S = 1e9
#: Smallest positive arrival rate (requests per second): one request in about 31 years.
MIN_RATE = 1e-9
#: Largest arrival rate (requests per second).
MAX_RATE = 1e9


class LimitError(ValueError):
    """An input exceeds a limit; the message names the limit, the value and how to raise it."""


def limit(name: str) -> int:
    """The current value of limit ``name`` (the environment variable wins over the default)."""
    env = f"HYBRIDSIM_MAX_{name.upper()}"
    raw = os.environ.get(env)
    if raw is None:
        return DEFAULTS[name]
    try:
        value = int(raw)
    except ValueError:
        raise LimitError(f"{env}={raw!r}: expected a positive integer") from None
    if value < 1:
        raise LimitError(f"{env}={raw!r}: expected a positive integer")
    return value


def over(name: str, value: int | float, what: str) -> str:
    """The message for ``what`` (e.g. 'the workload has 3000000 requests') exceeding limit ``name``."""
    return (
        f"{what}, more than the limit of {limit(name)} (set HYBRIDSIM_MAX_{name.upper()} to raise it; "
        "see docs/limits.md)"
    )


def check(name: str, value: int | float, what: str) -> None:
    """Raise :class:`LimitError` when ``value`` exceeds limit ``name``."""
    if value > limit(name):
        raise LimitError(over(name, value, what))
