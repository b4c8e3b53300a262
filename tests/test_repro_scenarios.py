"""The reproduction scenarios of scenarios/repro/, run end to end, with their admissions asserted exactly."""

from __future__ import annotations

from pathlib import Path

import pytest

from sim.analysis.divergence_table import CONNECTORS, DIRECTIONS, POLICIES, render
from sim.api import run_scenario
from sim.config import load_scenario
from sim.sweep.divergence import divergence_matrix

pytestmark = pytest.mark.slow  # end-to-end: runs whole scenarios (make test-fast skips it)

ROOT = Path(__file__).resolve().parents[1]
REPRO = ROOT / "scenarios" / "repro"
COLS = [
    "request_id",
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
    "taint_origin",
]
SEEDS = [  # the four seeding prefixes: each resumes from the previous one's hit
    ("seed0", 0, 0, 0, 0, False, False, 0, "ok", "", 0, ""),
    ("seed1", 16, 16, 16, 0, False, False, 16, "ok", "", 0, ""),
    ("seed2", 32, 32, 32, 0, False, False, 32, "ok", "", 0, ""),
    ("seed3", 48, 48, 48, 0, False, False, 48, "ok", "", 0, ""),
]


def _run(name: str, *overrides: str):
    return run_scenario(load_scenario(REPRO / name, overrides))


def _rows(result) -> list[tuple]:
    return [tuple(r) for r in result.admissions[COLS].itertuples(index=False, name=None)]


@pytest.mark.parametrize(
    "name, expected",
    [
        # vLLM #48425 test_hybrid_per_group_hit_divergence_with_connector: (ext, resume) = (0, 16), (16, 32).
        ("pr48425-mamba-deeper-ext0.yaml", ("r", 32, 64, 16, 0, False, False, 16, "ok", "", 0, "")),
        # Valid, but shown the FA hit (32) the connector would have answered 16 too: resume at 48 was valid.
        ("pr48425-mamba-deeper-ext16.yaml", ("r", 32, 64, 16, 16, False, False, 32, "recompute", "", 16, "")),
        # ..._fa_deeper_no_external: FA hit 64 flagged diverged, connector answers 0, fallback: resume at 16.
        ("pr48425-fa-deeper-ext0.yaml", ("r", 64, 16, 16, 0, True, True, 16, "ok", "", 0, "")),
    ],
)
def test_pr48425_unit_test_cases(name, expected):
    result = _run(name)
    assert _rows(result) == [*SEEDS, expected]
    assert result.summary["crash"] is None
    adm = result.summary["admissions"]
    assert adm["fallbacks"] == int(expected[6])
    assert adm["divergences"] == (
        {"mamba_deeper": 1, "fa_deeper": 0} if expected[1] < expected[2] else {"mamba_deeper": 0, "fa_deeper": 1}
    )


@pytest.mark.parametrize(
    "name, policy, expected",
    [
        # #46453 part 1: max(per-group hits) 64 + 16 external tokens = the whole 80-token prompt.
        (
            "pr48425-mamba-deeper-ext16.yaml",
            "max_per_group",
            ("r", 32, 64, 64, 16, False, False, 0, "crash", "AssertionError: num_new_tokens > 0", 0, ""),
        ),
        # #48425 with an opted-in connector: FA hit 64 + 16 reaches the end too.
        (
            "pr48425-fa-deeper-ext0.yaml",
            "pr48425",
            ("r", 64, 16, 64, 16, True, False, 0, "crash", "AssertionError: num_new_tokens > 0", 0, ""),
        ),
    ],
)
def test_claims_reaching_the_end_of_the_prompt_crash(name, policy, expected):
    result = _run(name, f"scheduler.prefix_policy={policy}", "connector.matched_tokens.r=16")
    assert _rows(result) == [*SEEDS, expected]
    assert result.summary["admissions"]["crash_reasons"] == {"AssertionError: num_new_tokens > 0": 1}
    assert result.requests.set_index("request_id").loc["r", "outcome"] == "crash"


#: (direction, policy, connector) -> (local, external, diverged, fallback, resume, outcome, tokens_lost)
MATRIX = {
    ("mamba_deeper", "reconciled", "supplies 16"): (16, 16, False, False, 32, "recompute", 16),
    ("mamba_deeper", "reconciled", "supplies none"): (16, 0, False, False, 16, "ok", 0),
    ("mamba_deeper", "pr48425", "supplies 16"): (16, 16, False, False, 32, "recompute", 16),
    ("mamba_deeper", "pr48425", "supplies none"): (16, 0, False, False, 16, "ok", 0),
    ("mamba_deeper", "max_per_group", "supplies 16"): (64, 16, False, False, 80, "corrupt", 0),
    ("mamba_deeper", "max_per_group", "supplies none"): (64, 0, False, False, 64, "corrupt", 0),
    ("mamba_deeper", "trim_to_min", "supplies 16"): (32, 16, False, False, 48, "ok", 0),
    ("mamba_deeper", "trim_to_min", "supplies none"): (32, 0, False, False, 32, "corrupt", 0),
    ("fa_deeper", "reconciled", "supplies 16"): (16, 16, False, False, 32, "recompute", 48),
    ("fa_deeper", "reconciled", "supplies none"): (16, 0, False, False, 16, "ok", 0),
    ("fa_deeper", "pr48425", "supplies 16"): (64, 16, True, False, 80, "ok", 0),
    ("fa_deeper", "pr48425", "supplies none"): (16, 0, True, True, 16, "ok", 0),
    ("fa_deeper", "max_per_group", "supplies 16"): (64, 16, False, False, 80, "ok", 0),
    ("fa_deeper", "max_per_group", "supplies none"): (64, 0, False, False, 64, "corrupt", 0),
    ("fa_deeper", "trim_to_min", "supplies 16"): (64, 16, False, False, 80, "ok", 0),
    ("fa_deeper", "trim_to_min", "supplies none"): (64, 0, False, False, 64, "corrupt", 0),
    # A connector holding the first 64 tokens answers 64 - shown.
    ("mamba_deeper", "reconciled", "holds 64"): (16, 48, False, False, 64, "ok", 0),
    ("mamba_deeper", "pr48425", "holds 64"): (16, 48, False, False, 64, "ok", 0),
    ("mamba_deeper", "max_per_group", "holds 64"): (64, 0, False, False, 64, "corrupt", 0),
    ("mamba_deeper", "trim_to_min", "holds 64"): (32, 32, False, False, 64, "ok", 0),
    ("fa_deeper", "reconciled", "holds 64"): (16, 48, False, False, 64, "ok", 0),
    # vLLM 0.33's fallback does not ask again: 48 tokens the connector holds are recomputed.
    ("fa_deeper", "pr48425", "holds 64"): (16, 0, True, True, 16, "recompute", 48),
    ("fa_deeper", "max_per_group", "holds 64"): (64, 0, False, False, 64, "corrupt", 0),
    ("fa_deeper", "trim_to_min", "holds 64"): (64, 0, False, False, 64, "corrupt", 0),
    # The what-if pr48425_requery: as pr48425, except that it asks again after the fallback.
    ("mamba_deeper", "pr48425_requery", "supplies 16"): (16, 16, False, False, 32, "recompute", 16),
    ("mamba_deeper", "pr48425_requery", "supplies none"): (16, 0, False, False, 16, "ok", 0),
    ("mamba_deeper", "pr48425_requery", "holds 64"): (16, 48, False, False, 64, "ok", 0),
    ("fa_deeper", "pr48425_requery", "supplies 16"): (64, 16, True, False, 80, "ok", 0),
    ("fa_deeper", "pr48425_requery", "supplies none"): (16, 0, True, True, 16, "ok", 0),
    ("fa_deeper", "pr48425_requery", "holds 64"): (16, 48, True, True, 64, "ok", 0),
}


@pytest.fixture(scope="module")
def matrix():
    return divergence_matrix(REPRO)


def test_divergence_matrix_outcomes(matrix):
    assert len(matrix) == len(DIRECTIONS) * len(POLICIES) * len(CONNECTORS) == len(MATRIX)
    for cell in matrix:
        assert cell.hits == ((32, 64) if cell.direction == "mamba_deeper" else (64, 16))
        got = (
            cell.local_tokens,
            cell.external_tokens,
            cell.hit_diverged,
            cell.fallback,
            cell.resume,
            cell.outcome,
            cell.tokens_lost,
        )
        assert got == MATRIX[cell.direction, cell.policy, cell.connector], cell
        assert cell.crash_reason == ""


def test_divergence_doc_is_generated_from_the_matrix(matrix):
    from sim.trace.output import unstamped

    doc = unstamped(".md", (ROOT / "docs" / "divergence.md").read_bytes())  # written by the command: stamped
    assert doc is not None and doc.decode("utf-8") == render(matrix), (
        "docs/divergence.md is stale: run hybridsim divergence-table --write docs/divergence.md"
    )


def test_taint_propagates_to_a_later_reuse_and_ends_with_eviction():
    result = _run("taint-propagation.yaml")
    assert _rows(result) == [
        *SEEDS,
        ("r", 32, 64, 64, 0, False, False, 64, "corrupt", "", 0, ""),
        ("r2", 80, 80, 80, 0, False, False, 80, "corrupt", "", 0, "r"),
        ("r3", 16, 16, 16, 0, False, False, 16, "ok", "", 0, ""),
    ]
    summary = result.summary
    assert summary["admissions"]["by_outcome"] == {"corrupt": 2, "ok": 5}
    assert summary["requests"]["by_outcome"] == {"corrupt": 2, "ok": 5}
    assert summary["goodput"]["requests"] == 5
    assert summary["admissions"]["divergences"] == {"mamba_deeper": 1, "fa_deeper": 0}


def test_recompute_is_summed_as_tokens_recomputed():
    result = _run("divergence-fa-deeper.yaml", "scheduler.prefix_policy=reconciled", "connector.matched_tokens.r=16")
    assert result.summary["admissions"]["tokens_recomputed"] == 48
    assert result.summary["admissions"]["by_outcome"] == {"ok": 4, "recompute": 1}


HOLDS_64 = ("connector.matched_tokens={}", "connector.holds.r=64")


def test_pr48425_fallback_does_not_ask_the_connector_again_and_its_cost_shows():
    """vLLM 0.33's answer, from its real Scheduler on CPU (this scenario's seeding and
    eviction, a MockKVConnector-like connector opted in to divergent hits that holds r's
    first 64 tokens): ``get_computed_blocks_for_connector`` gives 64 with ``hit_diverged``,
    the connector is asked once, at 64, and answers 0; ``get_computed_blocks`` gives 16 and
    the connector is not asked again; r runs 48 + 16 + 16 tokens at steps 17-19 from 16.
    Shown 16, the connector would have supplied 48: scored recompute, 48 tokens lost."""
    result = _run("divergence-fa-deeper.yaml", *HOLDS_64)
    assert _rows(result)[-1] == ("r", 64, 16, 16, 0, True, True, 16, "recompute", "", 48, "")
    sched = result.schedule[result.schedule["request_id"] == "r"]
    assert list(zip(sched["step"], sched["num_scheduled_tokens"], sched["num_computed_tokens"])) == [
        (17, 48, 16),
        (18, 16, 64),
        (19, 16, 80),
    ]


def test_pr48425_requery_asks_again_at_the_reconciled_boundary():
    """The what-if (not vLLM): after the fallback to 16 the connector is asked again and loads 48."""
    result = _run("divergence-fa-deeper.yaml", "scheduler.prefix_policy=pr48425_requery", *HOLDS_64)
    assert _rows(result)[-1] == ("r", 64, 16, 16, 48, True, True, 64, "ok", "", 0, "")
    sched = result.schedule[result.schedule["request_id"] == "r"]
    assert list(zip(sched["step"], sched["num_scheduled_tokens"], sched["num_computed_tokens"])) == [
        (17, 16, 64),
        (18, 16, 80),
    ]
