"""hybridsim explain: the exact story and block-map cells of a crash, a corrupt, a lost-reuse fallback and an ok admission."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from sim.analysis.explain import ExplainError, block_map, explain, render_block_map
from sim.api import explain_bundle, explain_inputs, run_scenario
from sim.cli import app
from sim.config import load_scenario

REPRO = Path(__file__).resolve().parents[2] / "scenarios" / "repro"
CRASH = ("pr48425-mamba-deeper-ext16.yaml", "scheduler.prefix_policy=max_per_group", "connector.matched_tokens.r=16")
HOLDS_64 = ("divergence-fa-deeper.yaml", "connector.matched_tokens={}", "connector.holds.r=64")


def _explain(name: str, *overrides: str, request: str = "r", attempt: int | None = None):
    scenario = load_scenario(REPRO / name, overrides)
    return explain(run_scenario(scenario), explain_inputs(scenario, request), request, attempt)


def _cells(story) -> list[tuple[str, tuple[str, ...]]]:
    return [(row.label, row.cells) for row in block_map(story)]


def test_crash_claims_the_whole_prompt_with_unbacked_full_attention_blocks():
    story = _explain(*CRASH)
    f = story.fields()
    assert f["g0 full_attention"] == "hit 32 tokens; blocks cached at the lookup: 0-1 (of 0-4, 16 tokens each)"
    assert f["g1 mamba"] == "hit 64 tokens; blocks cached at the lookup: 0, 3 (of 0-4, 16 tokens each)"
    assert f["policy"] == (
        "max_per_group chose local 64 from per-group hits (g0 32, g1 64); "
        "local is deeper than the full-attention hit 32"
    )
    assert f["connector"] == (
        "scripted: asked at 64, answered 16 tokens; external_tokens 16 (supplies the Mamba state at the boundary)"
    )
    assert f["fallback"] == "not fired (no hit_diverged)"
    assert f["outcome"] == (
        "crash: AssertionError: num_new_tokens > 0 (claimed boundary 80 = local 64 + external 16 of 80 prompt tokens)"
    )
    assert f["unbacked"] == "g0 blocks 2-3 (tokens 32-63)"
    assert f["mamba state"] == "g1: supplied by the connector at 80"
    assert f["best valid boundary"] == "16 (local cache only, at the lookup)"
    assert _cells(story) == [
        ("full_attention", ("claimed_backed", "claimed_backed", "claimed_unbacked", "claimed_unbacked", "external")),
        ("mamba", ("resident", "absent", "absent", "resident", "external")),
    ]


def test_corrupt_by_taint_names_the_origin_and_the_tainted_blocks():
    story = _explain("taint-propagation.yaml", request="r2")
    f = story.fields()
    assert f["outcome"] == "corrupt at resume boundary 80: a resident block is tainted (origin r)"
    assert f["taint origin"] == "r"
    assert f["unbacked"] == "none"
    assert f["mamba state"] == "g1: cached at 80 but tainted"
    # FA blocks 2-4 and the Mamba state at 80 were cached by r (corrupt): the clean boundary is 16.
    assert f["best valid boundary"] == "16 (local cache only, at the lookup)"
    assert _cells(story) == [
        (
            "full_attention",
            (
                "claimed_backed",
                "claimed_backed",
                "claimed_tainted",
                "claimed_tainted",
                "claimed_tainted",
                "resident_recomputed",
            ),
        ),
        ("mamba", ("resident", "absent", "absent", "resident", "claimed_tainted", "resident_recomputed")),
    ]


def test_corrupt_origin_shows_unbacked_full_attention_positions():
    story = _explain("taint-propagation.yaml", request="r")
    assert story.fields()["outcome"] == "corrupt at resume boundary 64: a needed block is not backed"
    assert story.fields()["unbacked"] == "g0 blocks 2-3 (tokens 32-63)"
    assert story.fields()["taint origin"] == "none"


def test_fallback_with_lost_reuse_shows_the_unasked_connector_and_the_recomputed_blocks():
    story = _explain(*HOLDS_64)
    f = story.fields()
    assert f["g0 full_attention"] == "hit 64 tokens; blocks cached at the lookup: 0-3 (of 0-5, 16 tokens each)"
    assert f["connector"] == "scripted: asked at 64, answered 0 tokens; external_tokens 0"
    assert f["fallback"] == (
        "fired: the lookup flagged hit_diverged and the connector answered 0, so the "
        "scheduler re-looked up the reconciled hit (local 16)"
    )
    assert f["outcome"] == "recompute: valid at 16, but 64 was valid: 48 tokens lost"
    assert f["best valid boundary"] == "64 (the truth checker's, local cache and connector)"
    assert _cells(story) == [
        # FA blocks 1-3 were cached at the lookup (hit 64): the fallback recomputes them although resident.
        ("full_attention", ("claimed_backed",) + ("resident_recomputed",) * 3 + ("recomputed",) * 2),
        ("mamba", ("claimed_backed",) + ("recomputed",) * 5),
    ]


def test_ok_admission():
    story = _explain("taint-propagation.yaml", request="r3")
    f = story.fields()
    assert f["admission"] == "r3 attempt 1 of 1, step 31, kind first, prompt 96 tokens"
    assert f["outcome"] == "ok: valid at resume boundary 16"
    assert f["unbacked"] == "none" and f["taint origin"] == "none"
    assert f["mamba state"] == "g1: cached at 16"
    assert f["best valid boundary"] == "16 (the truth checker's, local cache and connector)"
    # The state at 96 is still cached (a tainted one): resident, but the resume at 16 computes past it.
    assert _cells(story)[1] == ("mamba", ("claimed_backed",) + ("recomputed",) * 4 + ("resident_recomputed",))


def test_prefix_caching_off_explains_with_nothing_cached():
    """With prefix caching off vLLM hashes at the LCM block size, which the groups' blocks cannot be viewed at:
    nothing is ever cached, so every block is computed (it was an error: 'block size 16 is not a multiple of the
    hash block size 8192'; found by fuzz --e2e, seed 20261205, scenario 44)."""
    from sim.config import scenario_from_text

    scenario = scenario_from_text(
        "name: no-caching\nclock: steps\n"
        "cache: {block_size: 16, num_blocks: 40, groups: [full_attention, mamba], enable_prefix_caching: false}\n"
        "workload:\n  requests:\n"
        "    - {id: a, at: 0, prompt: [{content: doc, tokens: 64}], max_tokens: 2}\n"
        "    - {id: b, at: 3, prompt: [{content: doc, tokens: 80}], max_tokens: 2}\n",
        "no-caching.yaml",
    )
    story = explain(run_scenario(scenario), explain_inputs(scenario, "b"), "b", None)
    assert story.fields()["admission"].startswith("b attempt 1 of 1")
    assert all(group.resident == () for group in story.groups)


def test_identical_groups_merge_into_one_row():
    story = _explain(HOLDS_64[0], "cache.groups=[full_attention, mamba, mamba, mamba]", *HOLDS_64[1:])
    assert [(r.label, r.groups) for r in block_map(story)] == [("full_attention", (0,)), ("mamba ×3", (1, 2, 3))]


def test_unknown_request_and_attempt_are_clear_errors():
    scenario = load_scenario(REPRO / "taint-propagation.yaml")
    result = run_scenario(scenario)
    with pytest.raises(ExplainError, match="request 'nope' is not in the scenario's workload"):
        explain_inputs(scenario, "nope")
    with pytest.raises(ExplainError, match="request 'nope' has no admission attempt"):
        explain(result, explain_inputs(scenario, "r"), "nope")
    with pytest.raises(ExplainError, match="--attempt 2: request 'r' has attempts 1-1"):
        explain(result, explain_inputs(scenario, "r"), "r", 2)


def test_crash_bundle_points_to_explain_which_reads_it_back(tmp_path):
    scenario = load_scenario(REPRO / CRASH[0], CRASH[1:])
    run_scenario(scenario, tmp_path / "b")
    crash = json.loads((tmp_path / "b" / "crash.json").read_text())
    assert crash["claimed_boundary"] == 80
    assert crash["explain"] == f"hybridsim explain {tmp_path / 'b'} r --attempt 1"
    story = explain_bundle(tmp_path / "b", "r", 1)
    assert story.fields()["unbacked"] == "g0 blocks 2-3 (tokens 32-63)"
    assert render_block_map(story, tmp_path / "map.png").stat().st_size > 0
    out = CliRunner().invoke(app, ["explain", str(tmp_path / "b"), "r"])
    assert out.exit_code == 0 and "best valid boundary  16" in out.output
    bad = CliRunner().invoke(app, ["explain", str(tmp_path / "b"), "r", "--attempt", "3"])
    assert bad.exit_code == 2
