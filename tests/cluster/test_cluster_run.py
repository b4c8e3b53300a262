"""Cluster runs end to end: one instance is the plain run, requests are conserved, reruns are identical,
closed-loop sessions route their turns, and bad cluster sections are refused with the key named."""

from __future__ import annotations

from pathlib import Path

import pandas as pd
import pytest

import sim
from sim.config import ScenarioError, scenario_from_text
from sim.results.finalize import RunResult

SMALL = """
name: cluster-small
seed: 5
clock: steps
cache: {block_size: 16, num_blocks: 120, groups: [full_attention, mamba]}
scheduler: {max_num_seqs: 4, max_num_batched_tokens: 256, max_model_len: 4096, prefix_policy: pr48425}
outputs: {plots: false}
workload:
  generator:
    arrivals: {process: poisson, rate: 0.6}
    count: 60
    structure:
      kind: shared_system
      system: {num_prompts: 4, length: {dist: uniform, low: 60, high: 200}, zipf: 1.0}
      user_len: {dist: lognormal, mean: 40, sigma: 0.5}
    output: {dist: uniform, low: 2, high: 12}
"""


def _run(text: str, tmp_path: Path | None = None) -> RunResult:
    scenario = scenario_from_text(text)
    return sim.run_scenario(scenario, tmp_path)


def _cluster(extra: str) -> str:
    return SMALL + "cluster:\n" + "".join(f"  {line}\n" for line in extra.strip().splitlines())


def test_one_instance_cluster_is_the_plain_run() -> None:
    plain = _run(SMALL)
    one = _run(_cluster("instances: 1"))
    for name, table in plain.tables.items():
        stacked = one.tables[name]
        assert list(stacked.columns) == list(table.columns) + ["instance"]
        assert (stacked["instance"] == 0).all()
        pd.testing.assert_frame_equal(stacked.drop(columns="instance"), table)
    assert one.summary["cache"] == plain.summary["cache"]


@pytest.mark.parametrize("policy", ["round_robin", "least_loaded", "session_affinity", "prefix_aware"])
def test_every_request_ends_once_and_reruns_are_identical(policy: str) -> None:
    text = _cluster(f"instances: 3\nrouter: {{policy: {policy}}}")
    first, second = _run(text), _run(text)
    requests = first.tables["requests"]
    assert sorted(requests["request_id"]) == sorted(_run(SMALL).tables["requests"]["request_id"])
    assert requests["request_id"].is_unique
    routed = first.summary["cluster"]["routed"]
    assert sum(routed) == len(requests[requests["instance"] >= 0])
    assert [s["instance"] for s in first.summary["instances"]] == [0, 1, 2]
    for name, table in first.tables.items():
        pd.testing.assert_frame_equal(table, second.tables[name])
        # Each instance's rows are its own: a request's admissions are on the instance it was routed to.
    home = dict(zip(requests["request_id"], requests["instance"]))
    admissions = first.tables["admissions"]
    assert all(home[r] == i for r, i in zip(admissions["request_id"], admissions["instance"]))


def test_round_robin_spreads_requests_evenly() -> None:
    result = _run(_cluster("instances: 3\nrouter: {policy: round_robin}"))
    assert result.summary["cluster"]["routed"] == [20, 20, 20]


def test_prefix_aware_keeps_shared_prompts_together() -> None:
    """Four system prompts over four instances: routing on the cached prefix hits more than round robin."""
    rr = _run(_cluster("instances: 4\nrouter: {policy: round_robin}"))
    pa = _run(_cluster("instances: 4\nrouter: {policy: prefix_aware, load_weight: 0.05}"))
    assert pa.summary["cache"]["local_rate"] > rr.summary["cache"]["local_rate"]


def test_instance_overrides_apply_to_that_instance_only(tmp_path: Path) -> None:
    text = _cluster("instances:\n  - {}\n  - {cache: {num_blocks: 300}, scheduler: {max_num_seqs: 2}}")
    result = _run(text, tmp_path / "b")
    assert [s["num_blocks"] for s in result.summary["instances"]] == [120, 300]
    assert result.summary["num_blocks"] == 420
    assert (tmp_path / "b" / "summary.json").is_file()
    loaded = sim.load_result(tmp_path / "b")
    assert "instance" in loaded.tables["requests"].columns


def test_closed_sessions_route_released_turns() -> None:
    text = """
name: sessions
clock: steps
cache: {block_size: 16, num_blocks: 64, groups: [full_attention, mamba]}
scheduler: {max_num_seqs: 4, max_num_batched_tokens: 256, prefix_policy: pr48425}
outputs: {plots: false}
workload:
  sessions: {mode: closed}
  requests:
    - {id: t1, at: 0, prompt: [{content: chat, tokens: 40}], max_tokens: 3}
    - {id: t2, at: 0, after: t1, think: 2, max_tokens: 2,
       prompt: [{content: chat, tokens: 40}, {output_of: t1, tokens: 3}, {content: u2, tokens: 10}]}
    - {id: o1, at: 0, prompt: [{content: other, tokens: 40}], max_tokens: 3}
cluster: {instances: 2, router: {policy: session_affinity}}
"""
    result = _run(text)
    requests = result.tables["requests"].set_index("request_id")
    assert set(requests["outcome"]) == {"ok"}
    assert requests.loc["t1", "instance"] == requests.loc["t2", "instance"]
    assert requests.loc["t2", "arrival_s"] == requests.loc["t1", "finished_s"] + 2


@pytest.mark.parametrize(
    "extra, message",
    [
        ("instances: 0", "cluster.instances"),
        ("instances: [{cache: {block_size: 32}}]", "cluster.instances.0.cache.block_size: an instance may override"),
        ("instances: [{scheduler: {max_num_seqs: 0}}]", "cluster.instances.0: scheduler.max_num_seqs"),
        ("router: {policy: round_robbin}", "did you mean 'round_robin'"),
        ("router: {policy: least_loaded, group_aware: true}", "cluster.router.group_aware"),
        ("router: {view_delay: .inf}", "cluster.router.view_delay"),
    ],
)
def test_bad_cluster_sections_name_the_key(extra: str, message: str) -> None:
    with pytest.raises(ScenarioError, match=message.replace("(", r"\(").replace(".", r"\.")):
        _run(_cluster(extra))


def test_actions_are_refused_on_a_cluster() -> None:
    text = _cluster("instances: 2") + "actions:\n  - {at: 3, reset_prefix_cache: true}\n"
    with pytest.raises(ScenarioError, match="cluster: scripted actions"):
        scenario_from_text(text)


def test_commands_read_a_cluster_bundle(tmp_path: Path) -> None:
    from typer.testing import CliRunner

    from sim.cli import app

    scenario = tmp_path / "c.yaml"
    scenario.write_text(
        _cluster("instances: 2\nrouter: {policy: prefix_aware, group_aware: true}").replace(
            "outputs: {plots: false}", "outputs: {plots: true}"
        ),
        encoding="utf-8",
    )
    runner = CliRunner()
    bundle, plain = tmp_path / "cluster", tmp_path / "plain"
    assert runner.invoke(app, ["run", str(scenario), "-o", str(bundle), "-q"]).exit_code == 0
    plain_file = tmp_path / "p.yaml"
    plain_file.write_text(SMALL, encoding="utf-8")
    assert runner.invoke(app, ["run", str(plain_file), "-o", str(plain), "-q"]).exit_code == 0
    assert (bundle / "plots" / "index.md").is_file()
    for args in (
        ["show", str(bundle)],
        ["compare", str(bundle), str(plain)],
        ["trace", "diff", str(bundle), str(bundle)],
    ):
        result = runner.invoke(app, args)
        assert result.exit_code == 0, (args, result.output)
    requests = sim.load_result(bundle).tables["requests"]
    rid = str(requests.loc[requests["instance"] == 1, "request_id"].iloc[0])
    result = runner.invoke(app, ["explain", str(bundle), rid])
    assert result.exit_code == 0 and f"admission            {rid}" in result.output


def test_prefix_aware_sends_a_repeat_to_the_instance_that_cached_it() -> None:
    """Four documents, then each again in reverse order long after: every repeat goes where its first
    request's blocks are (the router's view is fed by the instances' KV events)."""
    first = "".join(
        f"    - {{id: a{i}, at: {i}, prompt: [{{content: doc{i}, tokens: 96}}], max_tokens: 2}}\n" for i in range(4)
    )
    again = "".join(
        f"    - {{id: b{i}, at: {60 + 3 - i}, prompt: [{{content: doc{i}, tokens: 96}}, {{content: q{i}, tokens: 8}}],"
        " max_tokens: 2}\n"
        for i in range(4)
    )
    text = f"""
name: repeats
clock: steps
cache: {{block_size: 16, num_blocks: 200, groups: [full_attention, mamba]}}
scheduler: {{max_num_seqs: 4, max_num_batched_tokens: 256, prefix_policy: pr48425}}
outputs: {{plots: false}}
workload:
  requests:
{first}{again}cluster: {{instances: 4, router: {{policy: prefix_aware, group_aware: true, load_weight: 0}}}}
"""
    result = _run(text)
    home = dict(zip(result.tables["requests"]["request_id"], result.tables["requests"]["instance"]))
    assert all(home[f"b{i}"] == home[f"a{i}"] for i in range(4)), home
    admissions = result.tables["admissions"].set_index("request_id")
    assert all(admissions.loc[f"b{i}", "local_tokens"] > 0 for i in range(4))


@pytest.fixture(scope="module")
def cluster_bundle(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A three-instance prefix_aware (group_aware) bundle with its plots."""
    out = tmp_path_factory.mktemp("cluster") / "bundle"
    text = _cluster("instances: 3\nrouter: {policy: prefix_aware, group_aware: true}")
    sim.run_scenario(scenario_from_text(text.replace("outputs: {plots: false}", "outputs: {plots: true}")), out)
    return out


def test_show_prints_one_row_per_instance(cluster_bundle: Path) -> None:
    from sim.analysis.report import instance_table, summary_rows

    summary = sim.load_result(cluster_bundle).summary
    header, rows = instance_table(summary)
    assert [r[0] for r in rows] == ["0", "1", "2"]
    routed = header.index("routed")
    assert [int(r[routed]) for r in rows] == summary["cluster"]["routed"]
    local = header.index("local hit rate")
    assert [r[local] for r in rows] == [f"{100 * i['cache']['local_rate']:.1f}%" for i in summary["instances"]]
    assert ("cluster", "3 instances, router prefix_aware (group_aware)") in summary_rows(summary)
    assert instance_table(_run(SMALL).summary)[1] == []


def test_compare_has_per_instance_rows(cluster_bundle: Path) -> None:
    from sim.analysis.compare import compare

    cluster = sim.load_result(cluster_bundle).summary
    plain = _run(SMALL).summary
    rows = {r.metric: r for r in compare({"cluster": cluster, "plain": plain}).rows}
    assert rows["instances"].values == (3, None)
    assert rows["router"].values == ("prefix_aware", None)
    for i, instance in enumerate(cluster["instances"]):
        assert rows[f"instance {i} routed"].values == (cluster["cluster"]["routed"][i], None)
        assert rows[f"instance {i} FA hit rate"].values == (instance["cache"]["full_attention_hit_rate"], None)
    assert "instance 3 routed" not in rows
    assert not any(m.startswith("instance") for m in (r.metric for r in compare({"a": plain, "b": plain}).rows))


def test_cluster_plots_draw_instances_and_router(cluster_bundle: Path, tmp_path: Path) -> None:
    from sim.analysis.plots import plot_all

    index = (cluster_bundle / "plots" / "index.md").read_text(encoding="utf-8")
    assert (cluster_bundle / "plots" / "instances.png").is_file()
    assert (cluster_bundle / "plots" / "router.png").is_file()
    assert not (cluster_bundle / "plots" / "block_usage.png").exists()  # one engine's series: drawn per instance
    assert "- `block_usage`: a cluster run" in index
    plain = sim.run_scenario(scenario_from_text(SMALL), None)
    names = [p.name for p in plot_all(plain, tmp_path / "plain")]
    assert "block_usage.png" in names and "router.png" not in names
    assert "instances" not in (tmp_path / "plain" / "index.md").read_text(encoding="utf-8")


def test_explain_names_the_instance(cluster_bundle: Path) -> None:
    requests = sim.load_result(cluster_bundle).tables["requests"]
    for index in (1, 2):
        rid = str(requests.loc[requests["instance"] == index, "request_id"].iloc[0])
        story = sim.api.explain_bundle(cluster_bundle, rid)
        assert story.fields()["instance"].startswith(f"{index} (routed by prefix_aware with group_aware")


def test_router_panel_numbers_come_from_the_instances(cluster_bundle: Path) -> None:
    from sim.analysis.plots import router_panel

    result = sim.load_result(cluster_bundle)
    panel = router_panel(result)
    assert panel is not None and panel.instances == [0, 1, 2]
    assert panel.router == "prefix_aware (group_aware)"
    assert panel.routed == result.summary["cluster"]["routed"]
    for i, instance in enumerate(result.summary["instances"]):
        cache = instance["cache"]
        assert panel.usable[i] == cache["local_rate"] and panel.fa_only[i] == cache["full_attention_hit_rate"]
        assert panel.usable_share[i] == pytest.approx(cache["local_rate"] / cache["full_attention_hit_rate"])
    steps = result.tables["steps"]
    # The step clock: every step lasts 1, so the time-weighted load is the queued total over the run's span.
    span = float((steps["time_s"] + steps["duration_s"]).max() - steps["time_s"].min())
    for i in panel.instances:
        mine = steps[steps["instance"] == i]
        queued = mine["running"] + mine["waiting"]
        assert panel.mean_queued is not None and panel.peak_queued is not None
        assert panel.mean_queued[i] == pytest.approx(float((queued * mine["duration_s"]).sum()) / span)
        assert panel.peak_queued[i] == queued.max()
    assert router_panel(_run(SMALL)) is None


SPLIT_SESSIONS = """
name: split-sessions
clock: steps
cache: {block_size: 16, num_blocks: 64, groups: [full_attention, mamba]}
scheduler: {max_num_seqs: 4, max_num_batched_tokens: 256, prefix_policy: pr48425}
outputs: {plots: false}
workload:
  sessions: {mode: MODE}
  requests:
    - {id: t1, at: 0, prompt: [{content: chat, tokens: 40}], max_tokens: 3}
    - {id: o1, at: 0, prompt: [{content: other, tokens: 40}], max_tokens: 3}
    - {id: o2, at: 0, prompt: [{content: more, tokens: 40}], max_tokens: 3}
    - {id: t2, at: 1, after: t1, think: 2, max_tokens: 2,
       prompt: [{content: chat, tokens: 40}, {output_of: t1, tokens: 3}, {content: u2, tokens: 10}]}
cluster: {instances: 2, router: {policy: round_robin}}
"""


@pytest.mark.parametrize("mode", ["open", "closed"])
def test_session_tables_span_instances(mode: str, tmp_path: Path) -> None:
    """A turn whose parent ran on another instance: the cluster's ``turns`` table still measures what it could
    reuse from that parent (each instance alone cannot: it crashed finalizing before), and the bundle has the
    session tables."""
    result = _run(SPLIT_SESSIONS.replace("MODE", mode), tmp_path / "b")
    requests = result.tables["requests"].set_index("request_id")
    assert requests.loc["t1", "instance"] != requests.loc["t2", "instance"]
    turns = result.session_tables["turns"].set_index("request_id")
    assert list(turns.index) == ["t1", "o1", "o2", "t2"]
    assert turns.loc["t2", "parents"] == "t1"
    assert turns.loc["t2", "reusable_tokens"] == 32  # two full blocks of t1's prompt + answer
    assert turns.loc["t2", "local_hit_tokens"] == 0  # its instance never saw t1
    assert result.summary["sessions"]["usable_hit_rate"] == 0.0
    assert sorted(p.name for p in (tmp_path / "b" / "sessions").iterdir()) == ["sessions.parquet", "turns.parquet"]


def test_prefix_aware_routing_without_prefix_caching_counts_nothing() -> None:
    """Without prefix caching a layout's hash block is the model length, which no group's blocks divide: the
    router's prefix count is 0 (nothing is ever cached), where it raised inside the run before."""
    text = SMALL.replace(
        "groups: [full_attention, mamba]}", "groups: [full_attention, mamba], enable_prefix_caching: false}"
    )
    result = _run(text + "cluster: {instances: 2, router: {policy: prefix_aware, group_aware: true}}\n")
    assert result.status == "complete"
    assert set(result.tables["requests"]["instance"]) == {0, 1}


STALLS_EARLY = """
name: stalls-early
clock: steps
cache: {block_size: 16, num_blocks: 26, groups: [full_attention, {type: sliding_window, window: 76}], retention_interval: 0}
scheduler: {max_num_seqs: 2, max_num_batched_tokens: 256, prefix_policy: pr48425, long_prefill_token_threshold: 48}
outputs: {plots: false}
workload:
  requests:
    - {id: big, at: 5, prompt: [{content: doc0, tokens: 192}, {content: tail1, tokens: 29}], max_tokens: 5}
    - {id: r2, at: 6, prompt: [{content: doc1, tokens: 66}, {content: tail2, tokens: 19}], max_tokens: 5}
    - {id: r0, at: 23, prompt: [{content: doc1, tokens: 194}, {content: tail0, tokens: 47}], max_tokens: 4}
cluster: {instances: 3, router: {policy: least_loaded}}
"""


def test_an_instance_stalled_early_takes_no_step_when_the_routing_ends() -> None:
    """Instance 0 gets ``big``, which its pool cannot hold, and idles from step 5; the last request (r0, step
    23) goes elsewhere. Knowing then that nothing more will come, instance 0 ends stalled without another
    step: it took one at step 23 (a second ``big`` attempt), which vLLM's idle engine, going to its next
    arrival (none), never takes (found by the e2e fuzz's cluster verify, seed 7007)."""
    result = _run(STALLS_EARLY)
    admissions = result.tables["admissions"]
    mine = admissions.loc[admissions["instance"] == 0]
    assert list(zip(mine["request_id"], mine["step"])) == [("big", 5)]
    assert result.summary["instances"][0]["steps"] == 6
    requests = result.tables["requests"].set_index("request_id")
    assert requests.loc["r0", "instance"] != 0 and requests.loc["big", "outcome"] != "ok"


def test_a_stalled_instance_leaves_the_others_running() -> None:
    """Instance 0 can never schedule ``big``: it ends alone, stalled, and the others serve r0 and r2 to the end
    (its stall stopped the whole cluster before, cutting r0 off at its arrival, which no vLLM engine does);
    the cluster's status says which instance stalled."""
    text = STALLS_EARLY.replace(
        "tokens: 194}, {content: tail0, tokens: 47}", "tokens: 100}, {content: tail0, tokens: 20}"
    )
    result = _run(text)
    requests = result.tables["requests"].set_index("request_id")
    assert requests.loc["r0", "instance"] != 0
    assert list(requests["outcome"]) == ["failed", "ok", "ok"]  # big, r2, r0 (arrival order)
    assert requests.loc["r0", "output_tokens"] == 4
    assert result.status == "stalled"
    assert result.summary["message"] == ("stalled: requests are waiting on instance(s) 0 but none can be scheduled")
