"""vLLM issue #46453 with the NIXL-like ``remote`` connector (scenarios/repro/nixl-*.yaml), asserted exactly.

NIXL's own checks cannot fire on the Mamba-deeper divergence under any
policy: the admission either pulls every unhashed block (refilling what
``max_per_group`` over-claimed) or, when the over-claimed hit already reaches
NIXL's remote token count, pulls nothing and leaves the FA gap dirty. See
docs/connectors.md, "#46453 with the remote connector".
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from sim.api import run_scenario
from sim.config import load_scenario

pytestmark = pytest.mark.slow  # end-to-end: runs whole scenarios (make test-fast skips it)

ROOT = Path(__file__).resolve().parents[1]
REPRO = ROOT / "scenarios" / "repro"
COLS = [
    "step",
    "request_id",
    "kind",
    "hit_g0",
    "hit_g1",
    "local_tokens",
    "external_tokens",
    "hit_diverged",
    "fallback",
    "num_computed_tokens",
    "outcome",
    "crash_reason",
    "tokens_lost",
]
SEEDS = [
    (0, "seed0", "first", 0, 0, 0, 0, False, False, 0, "ok", "", 0),
    (4, "seed1", "first", 16, 16, 16, 0, False, False, 16, "ok", "", 0),
    (8, "seed2", "first", 32, 32, 32, 0, False, False, 32, "ok", "", 0),
    (12, "seed3", "first", 48, 48, 48, 0, False, False, 48, "ok", "", 0),
]


def _run(name: str, policy: str | None = None, out_dir: Path | None = None):
    overrides = [f"scheduler.prefix_policy={policy}"] if policy else []
    return run_scenario(load_scenario(REPRO / name, overrides), out_dir)


def _rows(result) -> list[tuple]:
    return [tuple(r) for r in result.admissions[COLS].itertuples(index=False, name=None)]


def _async(local: int, ext: int, outcome: str) -> list[tuple]:
    """r's admission at step 17 (async pull planned) and its resume at step 18 (pull done)."""
    return [
        (17, "r", "first", 32, 64, local, ext, False, False, local + ext, outcome, "", 0),
        (18, "r", "after_async_load", 0, 0, 0, 0, False, False, local + ext, outcome, "", 0),
    ]


#: (scenario, policy) -> (r's admissions, refilled_local_tokens, blocks_pulled per group)
CASES = {
    # #44243's max(hits) = 64; NIXL answers 95 - 64 = 31 and pulls the 4 fresh FA blocks (positions
    # 2..5) plus the Mamba slot, refilling tokens 32..63. Truth checker: ok (the connector declares
    # pulls_unhashed_blocks, so the refill counts as supplied).
    ("nixl-mamba-deeper.yaml", "max_per_group"): (_async(64, 31, "ok"), 32, [4, 1]),
    # get_computed_blocks_for_connector: Mamba deeper than FA -> the reconciled hit 16.
    ("nixl-mamba-deeper.yaml", "pr48425"): (_async(16, 79, "ok"), 0, [5, 1]),
    ("nixl-mamba-deeper.yaml", "reconciled"): (_async(16, 79, "ok"), 0, [5, 1]),
    # the dense min 32: the very same blocks as max_per_group pulls.
    ("nixl-mamba-deeper.yaml", "trim_to_min"): (_async(32, 63, "ok"), 0, [4, 1]),
    # 65 tokens: NIXL's count R = 64 = the claimed hit, it answers 0; FA 32..63 stay dirty, no crash.
    ("nixl-mamba-deeper-ext0.yaml", "max_per_group"): (
        [(17, "r", "first", 32, 64, 64, 0, False, False, 64, "corrupt", "", 0)],
        0,
        [0, 0],
    ),
    ("nixl-mamba-deeper-ext0.yaml", "pr48425"): (_async(16, 48, "ok"), 0, [3, 1]),
    ("nixl-mamba-deeper-ext0.yaml", "reconciled"): (_async(16, 48, "ok"), 0, [3, 1]),
}


@pytest.mark.parametrize("name, policy", list(CASES))
def test_per_policy_outcome(name, policy):
    r_rows, refilled, pulled = CASES[(name, policy)]
    result = _run(name, policy)
    assert _rows(result) == [*SEEDS, *r_rows]
    summary = result.summary
    assert summary["crash"] is None and summary["admissions"]["crash_reasons"] == {}
    assert summary["admissions"]["divergences"] == {"mamba_deeper": 1, "fa_deeper": 0}
    metrics = summary["connector_metrics"]
    assert (metrics["refilled_local_tokens"], metrics["blocks_pulled"]) == (refilled, pulled)
    assert metrics["loads"] == (1 if pulled[0] else 0)
    assert result.requests.set_index("request_id").loc["r", "outcome"] == r_rows[0][10]


@pytest.mark.parametrize("name", ["nixl-mamba-deeper.yaml", "nixl-mamba-deeper-ext0.yaml"])
def test_as_written_max_per_group_with_on_crash_stop_writes_no_crash_json(name, tmp_path):
    scenario = load_scenario(REPRO / name)
    assert (scenario.scheduler.prefix_policy, scenario.on_crash) == ("max_per_group", "stop")
    result = run_scenario(scenario, tmp_path)
    assert result.status == "complete"
    assert not (tmp_path / "crash.json").exists() and not (tmp_path / "replay").exists()
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["crash"] is None and summary["requests"]["finished"] == 5
