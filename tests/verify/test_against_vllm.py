"""hybridsim against the real vLLM scheduler, 0.33 or 0.34, whichever is installed (see conftest.py).

Scenarios are verified as scenarios for the installed release (``vllm_version``
set to it): with the new knobs at their defaults the two releases decide alike.

* every bundled step-clock scenario with a verifiable policy is identical;
  the others are not verifiable for the reason listed in NOT_VERIFIABLE;
* ``hybridsim fuzz --count 200 --vllm`` with a fixed seed is all identical;
* verify bites: a reversed free-queue order patched into hybridsim gives exit 1
  naming the first differing step;
* a what-if option gives exit 3.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from typer.testing import CliRunner

from sim.cli import ExitCode, app
from sim.config import ScenarioError, load_scenario
from sim.verify.run import VerifyStatus, fuzz_command, verify_scenario

#: Not in the unit tier (`make test-fast`): differential: whole scenarios against the real vLLM.
pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]
SCENARIOS = sorted(p for p in (ROOT / "scenarios").rglob("*.yaml"))

#: Bundled step-clock scenarios vLLM cannot run, and why.
NOT_VERIFIABLE = {
    "nixl-mamba-deeper.yaml": "connector.type: 'remote'",
    "nixl-mamba-deeper-ext0.yaml": "connector.type: 'remote'",
    # Their scripted stand-ins are verified in tests/test_pathologies.py.
    "offload-eviction-assert.yaml": "connector.type: 'offload'",
    "external-kv-not-verified.yaml": "connector.type: 'offload'",
    "pd-decode-prefix-hit.yaml": "connector.type: 'remote'",
}

FUZZ_SEED = 20261201


def _step_scenarios() -> list[Path]:
    out = []
    for path in SCENARIOS:
        try:
            scenario = load_scenario(path)
        except ScenarioError:
            continue  # a sweep file, not a scenario
        if scenario.clock == "steps":
            out.append(path)
    return out


@pytest.mark.parametrize("path", _step_scenarios(), ids=lambda p: p.name)
def test_bundled_step_scenarios_are_identical(vllm, path):
    verdict = verify_scenario(load_scenario(path, [f"vllm_version={vllm}"]))
    if path.name in NOT_VERIFIABLE:
        assert verdict.label == "not verifiable" and NOT_VERIFIABLE[path.name] in verdict.reason
        return
    assert verdict.status is VerifyStatus.IDENTICAL, (
        verdict.difference.describe() if verdict.difference else verdict.reason
    )


def test_fuzz_200_fixed_seed_all_identical(vllm, tmp_path):
    lines: list[str] = []
    status = fuzz_command(FUZZ_SEED, 200, True, tmp_path, lines.append)
    assert status is VerifyStatus.IDENTICAL, "\n".join(lines)
    assert lines[-1].endswith("identical 200, differing 0, not verifiable 0, refused by hybridsim 0"), lines[-1]
    assert f"for vLLM {vllm}." in lines[-1]


def _for_installed(path: Path, release: str, tmp_path: Path) -> Path:
    """A copy of the scenario file ``path`` for vLLM ``release``."""
    copy = tmp_path / path.name
    copy.write_text(path.read_text() + f'\nvllm_version: "{release}"\n')
    return copy


def test_verify_bites_on_a_reversed_free_queue(vllm, monkeypatch, tmp_path):
    from sim.core.kv.block_pool import FreeKVCacheBlockQueue

    # Freed uncached blocks go to the back instead of the front (vLLM prepends them).
    monkeypatch.setattr(FreeKVCacheBlockQueue, "prepend_n", FreeKVCacheBlockQueue.append_n)
    path = _for_installed(ROOT / "scenarios" / "repro" / "divergence-mamba-deeper.yaml", vllm, tmp_path)
    table = tmp_path / "side.csv"
    result = CliRunner().invoke(app, ["verify", str(path), "--table", str(table)])
    assert result.exit_code == 1, result.output
    assert "differ" in result.output and "first difference at step " in result.output
    assert table.is_file() and "False" in table.read_text()


def test_what_if_option_is_not_verifiable(vllm, tmp_path):
    src = (ROOT / "scenarios" / "repro" / "divergence-mamba-deeper.yaml").read_text()
    path = tmp_path / "whatif.yaml"
    path.write_text(
        src.replace("  retention_interval: null\n", "  retention_interval: null\n  corrected_mamba_accounting: true\n")
    )
    result = CliRunner().invoke(app, ["verify", str(path)])
    assert result.exit_code == ExitCode.NOT_VERIFIABLE == 7, result.output
    assert "corrected_mamba_accounting" in result.output


CRASH = """
name: crash
clock: steps
cache: {block_size: 16, num_blocks: 40, groups: [full_attention, mamba]}
scheduler: {max_num_seqs: 2, max_num_batched_tokens: 64}
connector: {type: scripted, matched_tokens: {b: 48}}
workload:
  requests:
    - {id: a, at: 0, prompt: [{content: doc, tokens: 40}], max_tokens: 2}
    - {id: b, at: 3, prompt: [{content: doc, tokens: 48}], max_tokens: 1}
"""


def test_a_crash_is_compared_and_identical(vllm):
    from sim.config.load import scenario_from_text

    verdict = verify_scenario(scenario_from_text(CRASH + f'vllm_version: "{vllm}"\n', "crash.yaml"))
    assert verdict.status is VerifyStatus.IDENTICAL, verdict.difference.describe() if verdict.difference else ""
    crash = verdict.theirs["crash"]
    assert crash is not None and crash["request"] == "b" and crash["type"] == "AssertionError"
    assert crash == verdict.ours["crash"]


def test_record_false_only_steps(vllm):
    from sim.verify import vllm_side
    from sim.verify.lower import lower

    script = lower(
        load_scenario(ROOT / "scenarios" / "repro" / "divergence-mamba-deeper.yaml", [f"vllm_version={vllm}"])
    )
    full = vllm_side.run_script(script)
    bare = vllm_side.run_script(script, record=False)
    assert bare["steps"] == [] and full["steps"]
    assert bare["finished"] == full["finished"] and bare["num_steps"] == full["num_steps"]


def test_a_scenario_for_the_other_release_is_refused_naming_both(vllm, tmp_path):
    other = "0.33" if vllm == "0.34" else "0.34"
    path = _for_installed(ROOT / "scenarios" / "repro" / "divergence-mamba-deeper.yaml", other, tmp_path)
    result = CliRunner().invoke(app, ["verify", str(path)])
    assert result.exit_code == 2, result.output
    assert f"the scenario is for vLLM {other}" in result.output and f"vLLM {vllm}." in result.output
    assert f"make vllm-env VLLM={other}" in result.output and f"--set vllm_version={vllm}" in result.output
    again = CliRunner().invoke(app, ["verify", str(path), "--set", f"vllm_version={vllm}"])
    assert again.exit_code == 0, again.output


def test_fuzz_scenarios_are_for_the_installed_release(vllm, tmp_path):
    lines: list[str] = []
    assert fuzz_command(3, 2, True, tmp_path, lines.append, vllm_version=None) is VerifyStatus.IDENTICAL, lines
    other = "0.33" if vllm == "0.34" else "0.34"
    assert fuzz_command(3, 1, True, tmp_path, lines.append, vllm_version=other) is VerifyStatus.BAD_INPUT
    assert f"--vllm-version {other}" in lines[-1]


def test_verify_bites_on_colliding_token_ids(vllm, monkeypatch):
    """The lowering's one id per distinct token matters: with every content stream lowered onto one range
    (distinct prompts given equal ids), vLLM finds prefix hits hybridsim does not, and verify says so."""
    from sim.config.load import scenario_from_text
    from sim.core.tokens import output_stream
    from sim.verify import lower as lowering

    distinct = lowering.stream_bases

    def collided(requests):
        base, end = distinct(requests)
        outputs = {output_stream(r.request_id) for r in requests}
        first = min(b for s, b in base.items() if s not in outputs)
        return {s: b if s in outputs else first for s, b in base.items()}, end

    text = COLLIDE + f'vllm_version: "{vllm}"\n'
    assert verify_scenario(scenario_from_text(text, "collide.yaml")).status is VerifyStatus.IDENTICAL
    monkeypatch.setattr(lowering, "stream_bases", collided)
    verdict = verify_scenario(scenario_from_text(text, "collide.yaml"))
    assert verdict.status is VerifyStatus.DIFFER, verdict.reason


COLLIDE = """
name: collide
clock: steps
cache: {block_size: 16, num_blocks: 64, groups: [full_attention, mamba]}
scheduler: {max_num_seqs: 2, max_num_batched_tokens: 64}
workload:
  requests:
    - {id: a, at: 0, prompt: [{content: doc, tokens: 64}], max_tokens: 2}
    - {id: b, at: 6, prompt: [{content: other, tokens: 64}], max_tokens: 2}
"""
