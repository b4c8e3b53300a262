"""The seam's contract: the speed layer (sim.accel) changes nothing; with and without it every table is byte-identical.

Each scenario runs twice in-process, once with ``RunOptions(fast_paths=False)``
(the plain core: sim.core only) and once with the speed layer the build
chooses, the ``schedule`` table on; every table (as CSV text) and the summary
must match. Scenarios: every golden, repro and pathology scenario, seeded
random step-clock scenarios drawn below (layouts with full attention, Mamba
with and without prefill checkpoints, several identical Mamba groups, sliding
window, mixed block sizes; block pressure; watermark; priority; scripted
connector with sync and async loads; crashes recorded), decode-heavy cases and
demo-pressure on the time clock.

The unit tier (``-m "not slow"``, ``make test-fast``) runs a small set: a few
random scenarios and one decode-heavy case; the rest is in the slow tier.
"""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest
from support.interrupt import interrupt_at

from sim.accel import CountingKVCacheManager, QuietDecodeScheduler, QuietKVCacheManager
from sim.accel.quiet import QuietHorizons
from sim.accel.replicas import ReplicaCoordinator
from sim.api import RunOptions, run_scenario
from sim.config import load_scenario, scenario_from_text
from sim.core.kv.kv_cache_manager import KVCacheManager
from sim.core.scheduler import Scheduler
from sim.engine.build import build_components
from sim.engine.loop import EngineLoop
from sim.engine.run import build_run
from sim.engine.stretch import StretchLoop
from sim.results import finalize
from sim.trace.golden import GOLDEN_SCENARIOS

#: How many random scenarios (and decode-heavy cases) the unit tier runs; the slow tier runs the rest.
FAST_SEEDS = 3

ROOT = Path(__file__).resolve().parent.parent
FILES = sorted(
    {ROOT / "scenarios" / rel for rel in GOLDEN_SCENARIOS}
    | set((ROOT / "scenarios" / "repro").glob("*.yaml"))
    | set((ROOT / "scenarios" / "pathologies").glob("*.yaml"))
)
OVERRIDES = ["outputs.plots=false", "outputs.schedule_table=true"]


def _fingerprint(scenario, fast: bool) -> dict[str, str]:
    result = run_scenario(scenario, None, options=RunOptions(write_plots=False, fast_paths=fast))
    out = {name: df.to_csv(index=False) for name, df in sorted(result.tables.items())}
    out["summary"] = json.dumps(result.summary, sort_keys=True, default=str)
    return out


def _assert_same(scenario) -> dict[str, str]:
    plain = _fingerprint(scenario, fast=False)
    fast = _fingerprint(scenario, fast=True)
    assert plain.keys() == fast.keys()
    for name in plain:
        assert plain[name] == fast[name], f"{scenario.name}: table {name} differs between the plain and fast paths"
    return plain


def _tiered(values, fast: int = FAST_SEEDS):
    """The first ``fast`` values in the unit tier, the others marked slow."""
    return [v if i < fast else pytest.param(v, marks=pytest.mark.slow) for i, v in enumerate(values)]


class LayerCounts:
    """What the speed layer did in a test: ``allocate_slots`` calls its horizons skipped (``skips``) and
    running-loop passes its scheduler took as quiet decodes (``decodes``), over every run the test built."""

    def __init__(self) -> None:
        self.skips = 0
        self.schedulers: list[QuietDecodeScheduler] = []

    @property
    def decodes(self) -> int:
        return sum(s.num_quiet_decodes for s in self.schedulers)

    @property
    def reused(self) -> int:
        """Head-of-line lookups handed back instead of computed (sim.accel.lookups)."""
        return sum(s.head_lookups.num_reused for s in self.schedulers if s.head_lookups is not None)


@pytest.fixture
def layer(monkeypatch) -> LayerCounts:
    """Counts what the speed layer skipped (a case where it skips nothing shows nothing)."""
    counts = LayerCounts()
    covers = QuietHorizons.covers
    init = QuietDecodeScheduler.__init__

    def counting(self, request, num_new_tokens):
        hit = covers(self, request, num_new_tokens)
        counts.skips += hit
        return hit

    def registering(self, *args, **kwargs):
        init(self, *args, **kwargs)
        counts.schedulers.append(self)

    monkeypatch.setattr(QuietHorizons, "covers", counting)
    monkeypatch.setattr(QuietDecodeScheduler, "__init__", registering)
    return counts


def test_the_build_chooses_the_layer_once() -> None:
    """``fast_paths`` picks the manager class at build time: the speed layer's quiet horizons where their
    rules cover the layout, else its counting manager with the plain scheduler; the plain core when off."""
    scenario = load_scenario(ROOT / "scenarios" / "demo-pressure.yaml", OVERRIDES)
    fast = build_components(scenario, fast_paths=True)
    plain = build_components(scenario, fast_paths=False)
    assert fast is not None and plain is not None
    assert type(fast.kv_manager) is QuietKVCacheManager and type(fast.scheduler) is QuietDecodeScheduler
    assert type(plain.kv_manager) is KVCacheManager and type(plain.scheduler) is Scheduler
    window = scenario_from_text(random_scenario(0, ["[full_attention, {type: sliding_window, window: 64}]"]), "<w>")
    built = build_components(window, fast_paths=True)
    assert built is not None and type(built.kv_manager) is CountingKVCacheManager and type(built.scheduler) is Scheduler


@pytest.mark.slow
@pytest.mark.parametrize("path", FILES, ids=lambda p: p.stem)
def test_scenario_files_identical_with_and_without_fast_paths(path: Path) -> None:
    tables = _assert_same(load_scenario(path, OVERRIDES))
    assert tables["schedule"].count("\n") > 1


LAYOUTS = [
    "[full_attention]",
    "[full_attention, mamba]",
    "[full_attention, {type: mamba, prefill_checkpoints: true}]",
    "[full_attention, mamba, mamba]",
    "[full_attention, {type: sliding_window, window: 64}]",
    "[{type: full_attention, block_size: 32}, {type: mamba, prefill_checkpoints: true}]",
]


#: Several identical Mamba groups, as vLLM builds them for Nemotron-H.
REPLICA_LAYOUTS = [
    "[{type: mamba, prefill_checkpoints: true}, {type: mamba, prefill_checkpoints: true}, full_attention,"
    " {type: mamba, prefill_checkpoints: true}]",
    "[mamba, mamba, mamba, mamba, full_attention]",
]


def random_scenario(seed: int, layouts: list[str] = LAYOUTS) -> str:
    """A small step-clock scenario under block pressure, drawn from ``seed``."""
    rnd = random.Random(seed)
    count = rnd.randint(8, 40)
    layout = rnd.choice(layouts)
    retention = rnd.choice(["null", "0", "64"]) if layout != "[full_attention]" else "null"
    lines = [
        f"name: fuzz-{seed}",
        f"seed: {seed}",
        "clock: steps",
        "on_crash: record",
        "cache:",
        "  block_size: 16",
        f"  num_blocks: {rnd.choice([40, 60, 90, 140])}",
        f"  groups: {layout}",
        f"  retention_interval: {retention}",
        "scheduler:",
        f"  max_num_seqs: {rnd.choice([2, 4, 8])}",
        f"  max_num_batched_tokens: {rnd.choice([64, 256, 2048])}",
        "  max_model_len: 2048",
        f"  long_prefill_token_threshold: {rnd.choice([0, 0, 48])}",
        f"  policy: {rnd.choice(['fcfs', 'fcfs', 'priority'])}",
        f"  watermark: {rnd.choice([0.0, 0.0, 0.05])}",
        f"  prefix_policy: {rnd.choice(['pr48425', 'reconciled', 'max_per_group'])}",
    ]
    if rnd.random() < 0.5:
        holds = ", ".join(f"r{i}: {rnd.choice([16, 64, 200])}" for i in range(count) if rnd.random() < 0.3)
        lines += [
            "connector:",
            "  type: scripted",
            f"  holds: {{{holds}}}",
            f"  load_async: {rnd.choice(['false', 'true'])}",
            f"  supports_divergent_local_hybrid_hits: {rnd.choice(['false', 'true'])}",
        ]
    lines += [
        "workload:",
        "  generator:",
        f"    arrivals: {{process: poisson, rate: {rnd.choice([0.3, 1.0, 4.0])}}}",
        f"    count: {count}",
        "    structure:",
        "      kind: shared_system",
        f"      system: {{num_prompts: {rnd.randint(1, 4)}, length: {{dist: uniform, low: 20, high: 300}}, zipf: 1.0}}",
        "      user_len: {dist: uniform, low: 4, high: 120}",
        f"    output: {{dist: uniform, low: 1, high: {rnd.choice([4, 40, 120])}}}",
    ]
    return "\n".join(lines) + "\n"


@pytest.mark.parametrize("seed", _tiered(range(36)))
def test_random_scenarios_identical_with_and_without_fast_paths(seed: int) -> None:
    _assert_same(scenario_from_text(random_scenario(seed), f"<fuzz {seed}>", overrides=OVERRIDES))


@pytest.mark.parametrize("seed", _tiered(range(12), fast=2))
def test_identical_mamba_groups_identical_with_and_without_fast_paths(seed: int, layer: LayerCounts) -> None:
    """Replica groups (sim.accel.replicas): the followers apply their leader's decisions."""
    scenario = scenario_from_text(random_scenario(seed, REPLICA_LAYOUTS), f"<replicas {seed}>", overrides=OVERRIDES)
    built = build_components(scenario, fast_paths=True)
    assert built is not None and isinstance(built.kv_manager.coordinator, ReplicaCoordinator)
    _assert_same(scenario)
    assert layer.skips + layer.decodes > 0


# --------------------------------------------------------------------------- decode-heavy cases
# Many concurrent decodes inside their horizons (the common case the layer exists for), with and without
# the schedule table, preemptions, length caps and a connector; on_crash stop.


def _decode_scenario(
    name: str,
    *,
    layout: str,
    num_blocks: int,
    seqs: int,
    budget: int,
    rate: float,
    output: str,
    extra: str = "",
    clock: str = "steps",
    system: str = "low: 40, high: 400",
    user: str = "low: 4, high: 200",
    threshold: int = 0,
    policy: str = "fcfs",
    max_model_len: int = 4096,
) -> str:
    return f"""\
name: {name}
seed: 7
clock: {clock}
cache: {{block_size: 16, num_blocks: {num_blocks}, groups: {layout}}}
scheduler: {{max_num_seqs: {seqs}, max_num_batched_tokens: {budget}, max_model_len: {max_model_len},
            prefix_policy: pr48425, long_prefill_token_threshold: {threshold}, policy: {policy}}}
workload:
  generator:
    arrivals: {{process: poisson, rate: {rate}}}
    count: 80
    structure:
      kind: shared_system
      system: {{num_prompts: 3, length: {{dist: uniform, {system}}}, zipf: 1.0}}
      user_len: {{dist: uniform, {user}}}
    output: {output}
{extra}"""


DECODE_CASES = {
    # 64 concurrent long decodes, FA + Mamba.
    "many-decodes": dict(
        layout="[full_attention, mamba]",
        num_blocks=3000,
        seqs=64,
        budget=4096,
        rate=8.0,
        output="{dist: uniform, low: 100, high: 400}",
    ),
    # Tight pool: preemptions pop decodes inside their horizons from the end of `running`.
    "preemption": dict(
        layout="[full_attention, {type: mamba, prefill_checkpoints: true}]",
        num_blocks=120,
        seqs=32,
        budget=512,
        rate=4.0,
        output="{dist: uniform, low: 40, high: 300}",
    ),
    # Short prompts, a small budget: decodes take most of it every step.
    "budget-cuts": dict(
        layout="[full_attention]",
        num_blocks=2000,
        seqs=64,
        budget=40,
        rate=20.0,
        output="{dist: uniform, low: 30, high: 200}",
        system="low: 4, high: 12",
        user="low: 2, high: 8",
    ),
    # max_tokens below most EOS points: length-capped finishes right after a quiet stretch.
    "max-tokens": dict(
        layout="[full_attention, mamba]",
        num_blocks=1500,
        seqs=48,
        budget=2048,
        rate=4.0,
        output="{dist: uniform, low: 50, high: 500}\n    max_tokens: 90",
    ),
    # A scripted connector (sync and async loads) next to quiet decodes.
    "connector": dict(
        layout="[full_attention, mamba]",
        num_blocks=400,
        seqs=32,
        budget=1024,
        rate=4.0,
        output="{dist: uniform, low: 20, high: 200}",
        extra="connector: {type: scripted, holds: {r3: 64, r10: 200, r20: 16, r41: 64}, load_async: true}\n",
    ),
    # Priority preemption: the victim (latest arrival) may sit before the current request in `running`,
    # already scheduled this step as a quiet decode; it gives its token back.
    "priority": dict(
        layout="[full_attention, mamba]",
        num_blocks=110,
        seqs=32,
        budget=512,
        rate=4.0,
        output="{dist: uniform, low: 40, high: 300}",
        policy="priority",
    ),
    # Long prompts chunked by the threshold (Mamba-aligned) while others decode; prefill checkpoints.
    "chunked-prefills": dict(
        layout="[full_attention, {type: mamba, prefill_checkpoints: true}]",
        num_blocks=1500,
        seqs=32,
        budget=256,
        rate=4.0,
        output="{dist: uniform, low: 30, high: 200}",
        system="low: 200, high: 900",
        threshold=48,
    ),
    # Decodes running into max_model_len (length-capped there): the chunk clip at max_model_len - 1.
    "max-model-len": dict(
        layout="[full_attention, mamba]",
        num_blocks=3000,
        seqs=32,
        budget=2048,
        rate=4.0,
        output="{dist: uniform, low: 100, high: 600}",
        max_model_len=600,
    ),
}


@pytest.mark.parametrize("schedule_table", ["false", "true"])
@pytest.mark.parametrize("case", _tiered(sorted(DECODE_CASES), fast=1))
def test_decode_heavy_cases_identical(case: str, schedule_table: str, layer: LayerCounts) -> None:
    text = _decode_scenario(case, **DECODE_CASES[case])
    overrides = ["outputs.plots=false", f"outputs.schedule_table={schedule_table}"]
    tables = _assert_same(scenario_from_text(text, f"<{case}>", overrides=overrides))
    assert layer.decodes > 100, "hardly any quiet decode: the case does not exercise the layer"
    summary = json.loads(tables["summary"])
    assert summary["status"] == "complete"
    if schedule_table == "true":
        assert tables["schedule"].count("\n") > 1


#: Tight pools where waiting heads fail step after step (the last one with Nemotron-H's identical Mamba groups).
HEAD_OF_LINE_CASES = {
    "preemption": DECODE_CASES["preemption"],
    "priority": DECODE_CASES["priority"],
    "replicas": dict(DECODE_CASES["preemption"], layout=REPLICA_LAYOUTS[0], num_blocks=200),
}


@pytest.mark.parametrize("case", _tiered(list(HEAD_OF_LINE_CASES), fast=1))
def test_head_of_line_lookups_identical(case: str, layer: LayerCounts) -> None:
    """Waiting heads fail again and again (no blocks, no aligned chunk) while running requests cache and
    evict around them: a kept lookup must be dropped by every event naming one of its hashes, including
    events still pending when the next attempt comes (emitted by this step's running loop)."""
    text = _decode_scenario(case, **HEAD_OF_LINE_CASES[case])
    _assert_same(scenario_from_text(text, f"<{case}>", overrides=OVERRIDES))
    assert layer.reused > 50, "hardly any kept lookup reused: the case does not exercise sim.accel.lookups"


@pytest.mark.slow
def test_demo_pressure_identical_on_the_time_clock(layer: LayerCounts) -> None:
    """The step-time model reads the batch totals (Nemotron-H 8B on H100, time clock)."""
    _assert_same(load_scenario(ROOT / "scenarios" / "demo-pressure.yaml", OVERRIDES))
    assert layer.decodes > 0


#: Layouts with align-mode Mamba, where a what-if checkpoint placement applies (sim.core.policy.checkpoint).
PLACEMENT_LAYOUTS = [
    "[full_attention, mamba]",
    "[full_attention, {type: mamba, prefill_checkpoints: true}]",
    "[mamba, mamba, full_attention]",
]


@pytest.mark.parametrize("placement", ["branch_points", "every_block"])
@pytest.mark.parametrize("seed", _tiered(range(6), fast=1))
def test_checkpoint_placements_identical_with_and_without_fast_paths(
    seed: int, placement: str, layer: LayerCounts
) -> None:
    """A placement ends prefill chunks at extra Mamba states and keeps them cached: the quiet horizons
    must still only skip calls that change nothing."""
    overrides = [*OVERRIDES, f"cache.mamba_checkpoint_policy={placement}"]
    text = random_scenario(seed, PLACEMENT_LAYOUTS)
    _assert_same(scenario_from_text(text, f"<placement {placement} {seed}>", overrides=overrides))
    assert layer.skips + layer.decodes > 0


@pytest.mark.parametrize("placement", ["vllm", "branch_points"])
@pytest.mark.parametrize("seed", _tiered(range(4), fast=2))
def test_reuse_value_eviction_identical_with_and_without_fast_paths(
    seed: int, placement: str, layer: LayerCounts
) -> None:
    """reuse_value stamps blocks as they are freed (on_freed) and evicts by its own order: the fast paths
    must free and look up exactly as the plain layer does under it (head-of-line lookups included)."""
    overrides = [*OVERRIDES, "cache.eviction_policy=reuse_value", f"cache.mamba_checkpoint_policy={placement}"]
    text = random_scenario(seed, PLACEMENT_LAYOUTS)
    _assert_same(scenario_from_text(text, f"<reuse_value {placement} {seed}>", overrides=overrides))
    assert layer.skips + layer.decodes > 0


# ---------------------------------------------------------------- the steps table's counters
#: Every place the speed layer's counters (sim.accel.counters) move: hits touched, external blocks, new blocks,
#: window and Mamba skips, frees, entries stored, evicted by an allocation or a policy, dropped by a scripted
#: eviction and cleared by a reset (at step 55 every block is free; the cache fills again after it).
COUNTERS = """
name: counters-{name}
seed: 3
clock: steps
on_crash: record
cache: {{block_size: 16, num_blocks: {blocks}, groups: {groups}, eviction_policy: {policy}}}
scheduler: {{max_num_seqs: 4, max_num_batched_tokens: 128, max_model_len: 2048, prefix_policy: pr48425}}
connector: {{type: scripted, holds: {{c1: 64, c2: 200}}}}
outputs: {{plots: false, schedule_table: true}}
workload:
  requests:
    - {{id: a0, at: 0, prompt: [{{content: doc, tokens: 300}}, {{content: q0, tokens: 40}}], max_tokens: 30}}
    - {{id: a1, at: 2, prompt: [{{content: doc, tokens: 300}}, {{content: q1, tokens: 50}}], max_tokens: 20}}
    - {{id: c1, at: 4, prompt: [{{content: other, tokens: 150}}], max_tokens: 10}}
    - {{id: b0, at: 60, prompt: [{{content: doc, tokens: 300}}, {{content: q2, tokens: 30}}], max_tokens: 12}}
    - {{id: b1, at: 61, prompt: [{{content: doc, tokens: 300}}, {{content: q3, tokens: 70}}], max_tokens: 12}}
    - {{id: c2, at: 62, prompt: [{{content: more, tokens: 260}}], max_tokens: 8}}
    - {{id: d0, at: 63, prompt: [{{content: doc, tokens: 300}}, {{content: q4, tokens: 20}}], max_tokens: 40}}
actions:
  - {{at: 30, evict: {{prefix_of: a0, group: 0, blocks: [3, 4]}}}}
  - {{at: 55, reset_prefix_cache: true}}
"""
#: name -> (groups, eviction policy, blocks, the manager the fast build takes, its pool).
COUNTER_CASES = {
    # A sliding window: no quiet horizons, the counting manager with the plain scheduler.
    "window": (
        "[full_attention, {type: sliding_window, window: 64}]",
        "lru",
        60,
        "CountingKVCacheManager",
        "CountingBlockPool",
    ),
    # Mamba prefill checkpoints under a what-if eviction policy: the counting policy pool.
    "checkpoints-policy": (
        "[full_attention, {type: mamba, prefill_checkpoints: true}]",
        "group_coherent",
        60,
        "QuietKVCacheManager",
        "CountingPolicyBlockPool",
    ),
    # Replica groups: the followers count their own blocks.
    "replicas": (
        "[{type: mamba, prefill_checkpoints: true}, full_attention, {type: mamba, prefill_checkpoints: true}]",
        "lru",
        80,
        "QuietKVCacheManager",
        "CountingBlockPool",
    ),
}


@pytest.mark.parametrize("case", sorted(COUNTER_CASES))
def test_the_steps_tables_counters_identical_with_and_without_fast_paths(case: str) -> None:
    """The steps table's ``blocks_gN`` and ``cached_gN``: the core counts the tables and the cached map at every
    step, the speed layer keeps counters; the tables must be identical (a counter off by one anywhere shows)."""
    groups, policy, blocks, manager, pool = COUNTER_CASES[case]
    text = COUNTERS.format(name=case, groups=groups, policy=policy, blocks=blocks)
    scenario = scenario_from_text(text, f"<counters {case}>")
    built = build_components(scenario, fast_paths=True)
    assert built is not None
    assert type(built.kv_manager).__name__ == manager and type(built.kv_manager.block_pool).__name__ == pool
    assert isinstance(built.kv_manager.coordinator, ReplicaCoordinator) == (case == "replicas")
    tables = _assert_same(scenario)
    events = tables["kv_events"]
    assert ",cleared," in events and ",reset" in events and ",cache" in events
    steps = [line.split(",") for line in tables["steps"].splitlines()]
    header, rows = steps[0], steps[1:]
    held = [i for i, name in enumerate(header) if name.startswith("blocks_g")]
    cached = [i for i, name in enumerate(header) if name.startswith("cached_g")]
    assert all(any(int(row[i]) > 0 for row in rows) for i in held + cached)


# ---------------------------------------------------------------- quiet stretches on a single engine
#: demo-pressure (Nemotron-H 8B) as it is (stretches ended by arrivals all along the run), and at twice its
#: rate on a fifth of its blocks (preemptions; stretches where the queue drains), on either clock.
PRESSURE = ["cache.num_blocks=60", "workload.generator.arrivals.rate=3"]

#: The step clock with arrivals at whole steps (a step can start exactly at an arrival) all along the run, on
#: a small pool (preemptions).
STEPS_ARRIVALS = """
name: stretch-steps
seed: 11
clock: steps
cache: {block_size: 16, num_blocks: 60, groups: [full_attention, mamba]}
scheduler: {max_num_seqs: 8, max_num_batched_tokens: 256, max_model_len: 4096, prefix_policy: pr48425}
outputs: {plots: false, schedule_table: true}
workload:
  generator:
    arrivals: {process: poisson, rate: 0.06}
    count: 60
    structure:
      kind: shared_system
      system: {num_prompts: 3, length: {dist: uniform, low: 40, high: 120}, zipf: 1.0}
      user_len: {dist: lognormal, mean: 30, sigma: 0.5}
    output: {dist: uniform, low: 5, high: 150}
"""


def _stretch_scenario(clock: str, pressure: bool):
    if clock == "steps-arrivals":
        return scenario_from_text(STEPS_ARRIVALS, "<stretch-steps>")
    overrides = [*OVERRIDES, f"clock={clock}", *(PRESSURE if pressure else [])]
    return load_scenario(ROOT / "scenarios" / "demo-pressure.yaml", overrides)


def _single_run(scenario, *, fast: bool, stretches: bool = True, max_steps: int | None = None):
    """Every table and the summary of one single-engine run, and the steps its engine took in stretches."""
    run = build_run(scenario, RunOptions(write_plots=False, fast_paths=fast, max_steps=max_steps), stretches=stretches)
    record = run.execute()
    taken = run.loop.num_stretch_steps if isinstance(run.loop, StretchLoop) else 0
    result = finalize(record)
    out = {name: df.to_csv(index=False) for name, df in sorted(result.tables.items())}
    out["summary"] = json.dumps(result.summary, sort_keys=True, default=str)
    return taken, out, result


def _assert_same_with_stretches(scenario, max_steps: int | None = None):
    plain_taken, plain, _ = _single_run(scenario, fast=False, max_steps=max_steps)
    off_taken, off, _ = _single_run(scenario, fast=True, stretches=False, max_steps=max_steps)
    taken, fast, result = _single_run(scenario, fast=True, max_steps=max_steps)
    assert plain_taken == off_taken == 0
    assert plain.keys() == off.keys() == fast.keys()
    for name in plain:
        assert off[name] == plain[name], f"{scenario.name}: table {name} differs on the fast path"
        assert fast[name] == plain[name], f"{scenario.name}: table {name} differs with quiet stretches"
    return taken, result


def _arrivals_inside_decodes(result) -> int:
    """Requests that arrived while another request was decoding (a stretch had to end before them)."""
    requests = result.tables["requests"]
    first, finished = requests["first_token_s"].to_numpy(), requests["finished_s"].to_numpy()
    return sum(int(((first < t) & (finished > t)).any()) for t in requests["arrival_s"])


def test_the_build_chooses_stretches_once() -> None:
    """Fast paths on: the single engine's loop takes quiet stretches; off (``--plain``), with a connector or
    with a given step duration: the plain loop."""
    scenario = _stretch_scenario("time", pressure=False)
    assert type(build_run(scenario, RunOptions(fast_paths=True)).loop) is StretchLoop
    assert type(build_run(scenario, RunOptions(fast_paths=False)).loop) is EngineLoop
    assert type(build_run(scenario, RunOptions(fast_paths=True), stretches=False).loop) is EngineLoop
    assert type(build_run(scenario, RunOptions(fast_paths=True), step_duration=lambda o, s: 0.5).loop) is EngineLoop
    text = _decode_scenario("connector", **DECODE_CASES["connector"])
    assert type(build_run(scenario_from_text(text, "<c>"), RunOptions(fast_paths=True)).loop) is EngineLoop


@pytest.mark.parametrize(
    "clock, pressure, min_taken",
    [
        ("time", False, 5000),
        ("steps-arrivals", True, 300),
        pytest.param("time", True, 200, marks=pytest.mark.slow),
        pytest.param("steps", True, 200, marks=pytest.mark.slow),
        pytest.param("steps", False, 300, marks=pytest.mark.slow),
    ],
)
def test_single_engine_identical_with_quiet_stretches(clock: str, pressure: bool, min_taken: int) -> None:
    """Plain core, fast paths without stretches and with them: every table byte-identical, with arrivals
    inside decodes (the next arrival is what ends those stretches), and under preemptions."""
    taken, result = _assert_same_with_stretches(_stretch_scenario(clock, pressure))
    assert taken > min_taken, "hardly any step taken in a stretch: the case does not exercise sim.engine.stretch"
    assert _arrivals_inside_decodes(result) > 20
    if pressure:
        assert result.tables["requests"]["preemptions"].sum() > 20, "no preemptions: the case lost its pressure"


#: Each stop falls inside what would otherwise be a stretch (step numbers: the step clock's jump with the time).
@pytest.mark.parametrize(
    "clock, max_steps",
    [
        ("time", 330),
        ("steps-arrivals", 204),
        pytest.param("time", 7800, marks=pytest.mark.slow),
        pytest.param("steps-arrivals", 809, marks=pytest.mark.slow),
    ],
)
def test_single_engine_max_steps_stop_with_quiet_stretches(clock: str, max_steps: int) -> None:
    """``max_steps`` caps a stretch: the run stops on that step as the plain loop does."""
    taken, result = _assert_same_with_stretches(_stretch_scenario(clock, pressure=False), max_steps=max_steps)
    assert result.summary["status"] == "stopped"
    assert int(result.tables["steps"]["step"].max()) == max_steps - 1
    assert taken > 0


def _interrupted(scenario, *, fast: bool, at: float):
    """One run interrupted (a ``KeyboardInterrupt`` from a SimPy event) at simulated time ``at``; its tables
    and whether the engine was inside a stretch then."""
    run = build_run(scenario, RunOptions(write_plots=False, fast_paths=fast))
    interrupt_at(run.env, at)
    inside: list[bool] = []
    loop = run.loop
    if isinstance(loop, StretchLoop):
        settle = loop.settle

        def spy() -> bool:
            inside.append(loop._stretch is not None)
            return settle()

        loop.settle = spy  # type: ignore[method-assign]
    result = finalize(run.execute())
    out = {name: df.to_csv(index=False) for name, df in sorted(result.tables.items())}
    out["summary"] = json.dumps(result.summary, sort_keys=True, default=str)
    return out, any(inside)


@pytest.mark.parametrize("at", [0.9, 3.45])
def test_an_interrupt_inside_a_stretch_is_settled(at: float) -> None:
    """Stopped inside a stretch (between two step boundaries), the engine is left as the plain loop leaves it:
    the steps ended by then applied and recorded, the ``schedule()`` of the one in flight applied."""
    scenario = _stretch_scenario("time", pressure=False)
    plain, _ = _interrupted(scenario, fast=False, at=at)
    fast, inside = _interrupted(scenario, fast=True, at=at)
    assert inside, "the interrupt did not land inside a stretch: the case does not exercise settle()"
    assert json.loads(plain["summary"])["status"] == "interrupted"
    assert plain.keys() == fast.keys()
    for name in plain:
        assert fast[name] == plain[name], f"table {name} differs after an interrupt inside a stretch"
