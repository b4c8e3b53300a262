"""docs/limits.md lists every limit of sim.limits with its default and variable, and the fixed ranges the
code enforces (a limit added to the code without the page, or a changed default, fails here)."""

from __future__ import annotations

import re
from pathlib import Path

from sim import limits
from sim.trace.bundle_files import MAX_GROUPS

DOC = (Path(__file__).resolve().parents[1] / "docs" / "limits.md").read_text(encoding="utf-8")


def _documented_limits() -> dict[str, int]:
    """``{variable: default}`` from the page's table of limits."""
    out: dict[str, int] = {}
    for m in re.finditer(r"^\| [^|]+ \| ([0-9 ]+)(MiB)? *\| `HYBRIDSIM_MAX_([A-Z_]+)` \|", DOC, re.M):
        value = int(m.group(1).replace(" ", ""))
        out[m.group(3).lower()] = value * (1 << 20) if m.group(2) else value
    return out


def test_every_limit_is_documented_with_its_default() -> None:
    assert _documented_limits() == limits.DEFAULTS


def test_the_fixed_ranges_are_documented() -> None:
    assert f"{limits.MAX_TOKENS:,}".replace(",", " ") in DOC and "2^24" in DOC
    assert f"{limits.MAX_INT:,}".replace(",", " ") in DOC and "2^53" in DOC
    assert f"at most {limits.MAX_LABEL} of them" in DOC
    assert f"{limits.MAX_TIME_S:.0e}".replace("+0", "") in DOC
    assert f"for at most {MAX_GROUPS} groups" in DOC


def _accepts(key: str, value: float) -> bool:
    from pydantic import ValidationError

    from sim.config.scenario import HardwareOverrides

    try:
        HardwareOverrides.model_validate({key: value})
    except ValidationError:
        return False
    return True


def test_the_hardware_override_ranges_are_the_documented_ones() -> None:
    from sim.config.scenario import HardwareOverrides

    for key in HardwareOverrides.model_fields:
        assert not _accepts(key, 1e300) and not _accepts(key, float("inf")), key
    ranges = {"memory_bandwidth": (1e6, 1e18), "attn_decode_cta_bandwidth": (1e6, 1e18), "bf16_flops": (1e9, 1e21)}
    ranges |= {k: (1e-6, 1) for k in HardwareOverrides.model_fields if k.endswith("_efficiency")}
    ranges |= {k: (0, 3600.0) for k in HardwareOverrides.model_fields if k.endswith("_s")}
    for key, (lo, hi) in ranges.items():
        assert _accepts(key, lo) and _accepts(key, hi), key
        assert not _accepts(key, hi * 1.01) and not _accepts(key, lo * 0.99 if lo else -1e-9), key
    assert _accepts("memory_bytes", 1 << 20) and not _accepts("memory_bytes", (1 << 20) - 1)
    assert _accepts("memory_bytes", 1 << 50) and not _accepts("memory_bytes", (1 << 50) + 1)
    for text in ("1e6 to 1e18 bytes/s", "1e9 to 1e21 FLOP/s", "1 MiB to 1 PiB", "1e-6 to 1", "0 to 3600 s"):
        assert text in DOC
