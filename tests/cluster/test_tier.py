"""The shared KV tier (``cluster.tier``): the store's eviction and accounting, what instances find in it, the
tier's own divergence (FA chunks kept, the Mamba state at their end evicted), its table and summary section,
and the refusals."""

from __future__ import annotations

from pathlib import Path

import pandas as pd
import pytest

import sim
from sim.cluster.tier import SharedTier
from sim.config import ScenarioError, scenario_from_text
from sim.config.cluster import TierSection
from sim.connector.offload import LookupRecord
from sim.results.finalize import RunResult

# --------------------------------------------------------------------------- the store alone

MB = 1_000_000


def _tier(**spec: object) -> tuple[SharedTier, list[float]]:
    clock = [0.0]
    tier = SharedTier(TierSection.model_validate(spec), ["mamba", "full_attention"], lambda: clock[0])
    tier.chunk_tokens = 16
    return tier, clock


def test_per_group_budgets_evict_each_group_alone_and_log_who_caused_it() -> None:
    """Mamba's budget holds one state: instance 1's state evicts instance 0's, while both FA chunks stay."""
    tier, clock = _tier(capacity_gb=0.01, group_capacity=[0.15, 0.5])  # 1.5 MB and 5 MB
    assert tier.insert(0, 11, MB, "a", 0) and tier.insert(1, 11, 2 * MB, "a", 0)
    clock[0] = 3.0
    assert tier.insert(0, 22, MB, "b", 1) and tier.insert(1, 22, 2 * MB, "b", 1)
    assert not tier.contains(0, 11) and tier.contains(1, 11) and tier.contains(1, 22)
    rows = [(e.time, e.instance, e.kind, e.group, e.key, e.nbytes, e.request_id) for e in tier.log_rows]
    assert rows == [
        (0.0, 0, "stored", 0, 11, MB, "a"),
        (0.0, 0, "stored", 1, 11, 2 * MB, "a"),
        (3.0, 1, "removed", 0, 11, MB, "b"),
        (3.0, 1, "stored", 0, 22, MB, "b"),
        (3.0, 1, "stored", 1, 22, 2 * MB, "b"),
    ]
    assert not tier.insert(0, 33, 2 * MB, "c", 1)  # larger than Mamba's whole budget: refused, nothing evicted
    assert tier.contains(0, 22)


def test_shared_budget_evicts_the_least_recently_used_object_of_any_group_but_not_a_pinned_one() -> None:
    tier, _ = _tier(capacity_gb=0.003)  # 3 MB for everything
    tier.insert(0, 1, MB, "a", 0)
    tier.insert(1, 1, MB, "a", 0)
    tier.insert(1, 2, MB, "a", 0)
    tier.touch(0, 1)  # the Mamba state is now the most recently used
    tier.pin(1, 1, +1)  # FA chunk 1 is being loaded
    tier.insert(1, 3, MB, "b", 1)
    assert [tier.contains(g, k) for g, k in [(0, 1), (1, 1), (1, 2), (1, 3)]] == [True, True, False, True]


def test_loads_log_the_objects_read_and_the_summary_adds_up() -> None:
    tier, clock = _tier(capacity_gb=0.01)
    tier.insert(0, 5, MB, "a", 0)
    tier.insert(1, 5, 2 * MB, "a", 0)
    clock[0] = 7.0
    tier.loaded([(1, 5), (0, 5)], "c", 2)
    assert [(e.time, e.instance, e.kind, e.group, e.nbytes) for e in tier.log_rows[2:]] == [
        (7.0, 2, "loaded", 1, 2 * MB),
        (7.0, 2, "loaded", 0, MB),
    ]
    # One admission: 48 tokens beyond local 16 could come from the tier; FA alone reaches 64, Mamba 32.
    tier.admitted(LookupRecord(local=16, bound=64, group_ends=(32, 64), end=32), 2)
    tier.admitted(LookupRecord(local=64, bound=64, group_ends=(0, 0), end=0), 2)  # nothing left to look up
    s = tier.summary()
    assert (s["bytes_in"], s["bytes_out"], s["bytes_held"], s["evictions"]) == (3 * MB, 3 * MB, 3 * MB, 0)
    assert (s["admissions"], s["lookup_tokens"], s["usable_hit_tokens"]) == (1, 48, 16)
    assert s["diverged_admissions"] == 1  # FA reached a chunk deeper than the usable hit
    assert s["groups"]["full_attention"]["hit_rate"] == 1.0 and s["groups"]["mamba"]["hit_rate"] == pytest.approx(1 / 3)
    assert s["groups"]["mamba"]["loaded"] == 1 and s["groups"]["full_attention"]["bytes_out"] == 2 * MB


# --------------------------------------------------------------------------- the tier in a cluster run

DIVERGENCE = """
name: tier-divergence
seed: 1
clock: steps
model: {preset: nemotron-h-8b}
cache: {num_blocks: 40}
scheduler: {max_num_seqs: 4, max_num_batched_tokens: 1040, max_model_len: 16384, prefix_policy: pr48425}
outputs: {plots: false}
workload:
  requests:
    - {id: a, at: 0, output_len: 2, max_tokens: 2, prompt: [{content: doc-a, tokens: 3200}]}
    - {id: b, at: 1, output_len: 2, max_tokens: 2, prompt: [{content: doc-b, tokens: 3200}]}
    - {id: d, at: 2, output_len: 2, max_tokens: 2, prompt: [{content: doc-d, tokens: 100}]}
    - {id: c, at: 20, output_len: 2, max_tokens: 2,
       prompt: [{content: doc-a, tokens: 3200}, {content: question, tokens: 100}]}
cluster:
  instances: 2
  router: {policy: round_robin}
  tier:
    capacity_gb: 1
    group_capacity: [0.02, 0.02, 0.02, 0.02, 0.02, 0.02, 0.5]
"""
#: nemotron-h-8b: six Mamba groups and one FA group, all with 1040-token blocks of 17,039,360 bytes.
OBJECT_BYTES = 17_039_360


def _run(text: str, out: Path | None = None) -> RunResult:
    return sim.run_scenario(scenario_from_text(text), out)


def _admission(result: RunResult, request_id: str) -> pd.Series:
    admissions = result.tables["admissions"]
    return admissions[admissions["request_id"] == request_id].iloc[0]


def test_fa_chunks_in_the_tier_without_the_mamba_state_give_no_hit() -> None:
    """a (instance 0) stores three FA chunks and Mamba states at 1040, 2080 and 3120; each Mamba group's budget
    holds one state, so b's states (instance 1) evict a's. c repeats a's prompt on instance 1: the tier holds
    every FA chunk of it and no Mamba state at any of their ends, so the offload lookup (vLLM's: a Mamba group is
    a one-chunk sliding window) answers 0 and c recomputes all 3300 tokens."""
    result = _run(DIVERGENCE)
    c = _admission(result, "c")
    assert (c["instance"], c["local_tokens"], c["external_tokens"], c["outcome"]) == (1, 0, 0, "ok")
    events = result.tier_tables["tier_events"]
    fa = events[events["group_kind"] == "full_attention"]
    assert list(fa["kind"]) == ["stored"] * 6 and list(fa["instance"]) == [0, 0, 1, 0, 1, 1]
    # Before c arrived, group 0 held only b's last state; a's states went, each evicted by a later store.
    before_c = events[(events["group"] == 0) & (events["time"] < 20)]
    assert list(before_c["kind"]) == ["stored"] + ["removed", "stored"] * 5
    assert list(before_c["request_id"].iloc[-1:]) == ["b"]
    assert not (events["kind"] == "loaded").any()
    tier = result.summary["tier"]
    assert (tier["admissions"], tier["lookup_tokens"], tier["usable_hit_tokens"]) == (3, 9360, 0)
    assert tier["diverged_admissions"] == 1
    assert tier["groups"]["full_attention"]["hit_tokens"] == 3120 and tier["groups"]["mamba"]["hit_tokens"] == 0


def test_the_same_run_with_room_for_every_state_loads_the_prefix_from_the_tier() -> None:
    text = DIVERGENCE.replace("    group_capacity: [0.02, 0.02, 0.02, 0.02, 0.02, 0.02, 0.5]\n", "")
    result = _run(text)
    c = _admission(result, "c")
    assert (c["instance"], c["local_tokens"], c["external_tokens"]) == (1, 0, 3120)
    loads = result.tier_tables["tier_events"].query("kind == 'loaded'")
    # Three FA chunks and, per Mamba group, the one state at 3120: all read by instance 1 for c.
    assert len(loads) == 3 + 6 and set(loads["instance"]) == {1} and set(loads["request_id"]) == {"c"}
    assert (loads["bytes"] == OBJECT_BYTES).all()
    tier = result.summary["tier"]
    assert tier["usable_hit_tokens"] == 3120 and tier["diverged_admissions"] == 0
    assert tier["bytes_out"] == 9 * OBJECT_BYTES and tier["evictions"] == 0


def test_one_instance_on_the_tier_decides_as_the_offload_connector_alone(tmp_path: Path) -> None:
    """A one-instance cluster with a tier is the plain run with the offload connector of the same options: the
    same admissions, schedule and requests; the tier's changes are the offload tier's ``kv_events`` rows."""
    tiered = DIVERGENCE.replace("instances: 2", "instances: 1")
    plain = tiered[: tiered.index("cluster:")] + (
        "connector: {type: offload, capacity_gb: 1, group_capacity: [0.02, 0.02, 0.02, 0.02, 0.02, 0.02, 0.5]}\n"
    )
    one, alone = _run(tiered), _run(plain)
    for name in ("admissions", "requests", "schedule"):
        # ``lookup_seq`` points into ``kv_events``, where the plain run also has its offload tier's rows.
        drop = ["lookup_seq"] if name == "admissions" else []
        pd.testing.assert_frame_equal(
            one.tables[name].drop(columns=["instance", *drop]), alone.tables[name].drop(columns=drop)
        )
    kv = alone.tables["kv_events"]
    own = kv[kv["block_id"] >= 0].reset_index(drop=True)
    pd.testing.assert_frame_equal(
        one.tables["kv_events"].drop(columns="instance").drop(columns="seq"), own.drop(columns="seq")
    )
    offload_rows = kv[kv["block_id"] < 0]
    events = one.tier_tables["tier_events"]
    changes = events[events["kind"] != "loaded"]
    assert list(changes["block_hash"]) == list(offload_rows["block_hash"])
    assert list(changes["kind"]) == list(offload_rows["kind"])


TIME_CLUSTER = """
name: tier-time
seed: 3
clock: time
model: {preset: nemotron-h-8b}
hardware: {preset: h100-80g}
cache: {num_blocks: 30}
scheduler: {max_num_seqs: 8, prefix_policy: pr48425}
outputs: {plots: false}
workload:
  generator:
    arrivals: {process: poisson, rate: 8}
    count: 60
    structure:
      kind: shared_system
      system: {num_prompts: 6, length: {dist: uniform, low: 2500, high: 6000}, zipf: 1.0}
      user_len: {dist: lognormal, mean: 60, sigma: 0.5}
    output: {dist: uniform, low: 2, high: 20}
cluster:
  instances: 3
  router: {policy: round_robin}
  tier: {capacity_gb: 2, read_gbps: 5, write_gbps: 5}
"""


def test_every_request_finishes_once_the_store_balances_and_reruns_are_identical(tmp_path: Path) -> None:
    first = _run(TIME_CLUSTER, tmp_path / "b")
    second = _run(TIME_CLUSTER)
    requests = first.tables["requests"]
    assert requests["request_id"].is_unique and len(requests) == 60
    assert set(requests["outcome"]) == {"ok"} and (requests["instance"] >= 0).all()
    events = first.tier_tables["tier_events"]
    pd.testing.assert_frame_equal(events, second.tier_tables["tier_events"])
    for name, table in first.tables.items():
        pd.testing.assert_frame_equal(table, second.tables[name])
    tier = first.summary["tier"]
    stored = events.loc[events["kind"] == "stored", "bytes"].sum()
    removed = events.loc[events["kind"] == "removed", "bytes"].sum()
    assert tier["bytes_held"] == stored - removed <= tier["capacity_bytes"]
    assert tier["bytes_out"] > 0 and set(events.loc[events["kind"] == "loaded", "instance"]) == {0, 1, 2}
    assert events["time"].is_monotonic_increasing
    # Some instance loaded an object another instance stored: the store is shared.
    stored_by = dict(
        zip(events.loc[events["kind"] == "stored", "block_hash"], events.loc[events["kind"] == "stored", "instance"])
    )
    loads = events[events["kind"] == "loaded"]
    assert any(stored_by.get(h) not in (None, i) for h, i in zip(loads["block_hash"], loads["instance"]))
    loaded = sim.load_result(tmp_path / "b")
    pd.testing.assert_frame_equal(loaded.tier_tables["tier_events"], events, check_dtype=False)


def test_a_cluster_without_a_tier_writes_no_tier_table_or_section(tmp_path: Path) -> None:
    text = TIME_CLUSTER.replace("  tier: {capacity_gb: 2, read_gbps: 5, write_gbps: 5}\n", "")
    result = _run(text, tmp_path / "b")
    assert result.tier_tables == {} and "tier" not in result.summary
    assert not (tmp_path / "b" / "tier").exists()
    assert result.summary["connector"] == "none"


@pytest.mark.parametrize(
    "tier, message",
    [
        ("{capacity_gb: 0}", "cluster.tier.capacity_gb"),
        ("{capacity_gb: 1, read_gbps: -1}", "cluster.tier.read_gbps"),
        ("{capacity_gb: 1, eviction: fifo}", "cluster.tier.eviction"),
        ("{capacity_gb: 1, store: sometimes}", "cluster.tier.store"),
        ("{capacity_gb: 1, chunk_tokens: 100}", "cluster.tier.chunk_tokens: 100 is not a multiple"),
        ("{capacity_gb: 1, group_capacity: [0.5, 0.5]}", "cluster.tier.group_capacity: 2 fractions given for 7"),
        ("{capacity_gb: 1, group_capacity: [0.2, 0.2, 0.2, 0.2, 0.2, 0.2, 0.2]}", "the fractions sum to 1.4"),
        ("{capacity_gb: 1, sizes: 3}", "cluster.tier.sizes: unknown key"),
    ],
)
def test_bad_tier_values_name_the_key(tier: str, message: str) -> None:
    text = DIVERGENCE[: DIVERGENCE.index("  tier:")] + f"  tier: {tier}\n"
    with pytest.raises(ScenarioError, match=message.replace("[", r"\[").replace(".", r"\.")):
        _run(text)


def test_a_tier_with_an_own_connector_is_refused() -> None:
    text = DIVERGENCE + "connector: {type: remote}\n"
    with pytest.raises(ScenarioError, match="cluster.tier: every instance's connector is the shared tier's"):
        _run(text)


def test_verify_refuses_a_tier_cluster_on_the_time_clock_in_one_line() -> None:
    """A tier cluster is verified by replaying its recorded answers (tests/verify/test_cluster_replay.py); what
    its instances cannot verify is still refused, naming the instance."""
    from sim.verify.cluster import verify_cluster
    from sim.verify.run import VerifyStatus

    verdict = verify_cluster(
        scenario_from_text(DIVERGENCE.replace("clock: steps", "clock: time\nhardware: {preset: h100-80g}"))
    )
    assert verdict.status is VerifyStatus.NOT_VERIFIABLE and verdict.reason.startswith("instance 0: clock: time")
    assert "\n" not in verdict.reason


def test_docs_list_the_tier_events_columns_in_order() -> None:
    import re

    from sim.results.cluster import TIER_EVENT_COLUMNS

    text = (Path(__file__).resolve().parents[2] / "docs" / "cluster.md").read_text(encoding="utf-8")
    table = text[text.index("**Results.** `tier/tier_events`") :].split("\n\n")[1]
    assert tuple(re.findall(r"^\| `([^`]+)` \|", table, re.M)) == TIER_EVENT_COLUMNS
