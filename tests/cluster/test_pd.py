"""Prefill/decode disaggregation in a cluster: the proxy's hand-offs, what a decode instance pulls (exactly what
its prefill instance computed), TTFT from the client's arrival, conservation of requests and legs, refusals."""

from __future__ import annotations

from pathlib import Path

import pandas as pd
import pytest

import sim
from sim.cluster.pd import Disaggregation, prefill_leg
from sim.config import ScenarioError, scenario_from_text
from sim.core.request import Request, StreamSegment
from sim.results.finalize import RunResult

# --------------------------------------------------------------------------- the proxy alone


def _request(rid: str = "r", tokens: int = 100) -> Request:
    return Request(rid, [StreamSegment("doc", 0, tokens)], max_tokens=8, arrival_time=2.0, output_len=5)


def _proxy() -> tuple[Disaggregation, list[tuple[str, object]]]:
    log: list[tuple[str, object]] = []
    pd_ = Disaggregation(
        release=lambda i, leg: log.append(("release", (i, leg.request_id))),
        wake=lambda i: log.append(("wake", i)),
        on_idle=lambda: log.append(("idle", None)),
    )
    return pd_, log


def test_a_leg_is_the_prompt_with_one_output_token_at_the_client_arrival() -> None:
    request = _request()
    leg = prefill_leg(request)
    assert (leg.request_id, leg.max_tokens, leg.output_len, leg.arrival_time) == ("r@prefill", 1, 1, 2.0)
    assert leg.prompt == request.prompt and leg.num_prompt_tokens == 100


def test_the_decode_side_waits_for_the_leg_and_the_prefill_side_frees_after_the_pull() -> None:
    pd_, log = _proxy()
    request = _request()
    pd_.start(request, prefill_instance=0, decode_instance=2)
    assert log == [("release", (0, "r@prefill"))] and pd_.busy()
    handed: list[str] = []
    pd_.submit(request, 99, lambda: handed.append("r"))
    assert handed == []  # the leg is still running
    leg = pd_._legs["r"].leg
    assert not pd_.hold(_request("r@prefill"))  # not the leg the proxy started: freed at once
    assert pd_.hold(leg) and handed == ["r"] and log[-1] == ("wake", 2)
    assert pd_.released(0) == set()  # held until the decode instance pulled
    pd_.pulled(request)
    assert pd_.released(0) == {"r@prefill"} and pd_.released(0) == set()
    assert log[-2:] == [("wake", 0), ("idle", None)] and not pd_.busy()
    pd_.pulled(request)  # a second report changes nothing
    assert pd_.released(0) == set()


def test_a_leg_finished_before_the_decode_side_asks_is_handed_over_at_once() -> None:
    pd_, _ = _proxy()
    request = _request()
    pd_.start(request, 1, 0)
    assert pd_.hold(pd_._legs["r"].leg)
    handed: list[str] = []
    pd_.submit(request, 99, lambda: handed.append("r"))
    assert handed == ["r"]


# --------------------------------------------------------------------------- P/D clusters

ONE = """
name: pd-one
seed: 1
clock: steps
model: {preset: nemotron-h-8b}
cache: {num_blocks: 40}
scheduler: {max_num_seqs: 4, max_num_batched_tokens: 8192, max_model_len: 16384, prefix_policy: pr48425}
outputs: {plots: false}
workload:
  requests:
    - {id: a, at: 0, output_len: 3, max_tokens: 3, prompt: [{content: doc-a, tokens: 3200}]}
cluster:
  instances: [{role: prefill}, {role: decode}]
"""
#: nemotron-h-8b: six Mamba groups and one FA group, all with 1040-token blocks of 17,039,360 bytes.
BLOCK_BYTES = 17_039_360


def _run(text: str) -> RunResult:
    return sim.run_scenario(scenario_from_text(text), None)


def test_the_decode_instance_pulls_what_the_prefill_instance_computed() -> None:
    """a's leg prefills 3200 tokens on instance 0 (step 0) and makes its one token; instance 1 then gets a,
    answers R - local = 3199 tokens (NIXL leaves one token to the decoder on a Mamba hybrid), pulls four FA
    blocks and one state per Mamba group, and computes the last token: its first token comes after the
    leg's, and TTFT counts from the client's arrival."""
    result = _run(ONE)
    requests = result.tables["requests"].set_index("request_id")
    leg, a = requests.loc["a@prefill"], requests.loc["a"]
    assert (leg["instance"], a["instance"]) == (0, 1)
    assert (leg["output_tokens"], leg["outcome"], a["output_tokens"], a["outcome"]) == (1, "ok", 3, "ok")
    assert (a["local_hit_tokens"], a["external_hit_tokens"]) == (0, 3199)
    assert a["arrival_s"] == leg["arrival_s"] == 0 and a["first_token_s"] > leg["first_token_s"]
    pd_ = result.summary["pd"]
    assert (pd_["prefills"], pd_["pulls"], pd_["pulled_tokens"]) == (1, 1, 3199)
    assert pd_["bytes_pulled"] == (4 + 6) * BLOCK_BYTES
    decode = result.summary["instances"][1]["connector_metrics"]
    assert decode["blocks_pulled"] == [1, 1, 1, 1, 1, 1, 4]
    # The cluster's totals are the client's view: one request, its TTFT from arrival at step 0.
    assert result.summary["requests"]["total"] == 1
    assert result.summary["latency_s"]["ttft"]["p50"] == a["first_token_s"] - a["arrival_s"]


def test_a_prefix_cached_on_the_decode_instance_shortens_the_pull() -> None:
    """b shares a's first 2080 tokens; after a, the decode instance holds them, so b pulls only the rest."""
    text = ONE.replace(
        "cluster:",
        "    - {id: b, at: 30, output_len: 3, max_tokens: 3,\n"
        "       prompt: [{content: doc-a, tokens: 2080}, {content: doc-b, tokens: 1500}]}\ncluster:",
    )
    result = _run(text)
    b = result.tables["requests"].set_index("request_id").loc["b"]
    assert b["local_hit_tokens"] > 0
    assert b["local_hit_tokens"] + b["external_hit_tokens"] == 3580 - 1


PD_TIME = """
name: pd-time
seed: 5
clock: time
model: {preset: nemotron-h-8b}
hardware: {preset: h100-80g}
cache: {num_blocks: 60}
scheduler: {max_num_seqs: 4, max_num_batched_tokens: 2048, max_model_len: 16384, prefix_policy: pr48425}
outputs: {plots: false}
workload:
  generator:
    arrivals: {process: poisson, rate: 6}
    count: 40
    structure:
      kind: shared_system
      system: {num_prompts: 4, length: {dist: uniform, low: 2500, high: 6000}, zipf: 1.0}
      user_len: {dist: lognormal, mean: 40, sigma: 0.5}
    output: {dist: uniform, low: 2, high: 12}
cluster:
  instances: [{role: prefill}, {role: decode}, {role: decode}]
  router: {policy: round_robin}
  pd: {bandwidth_gbps: 10, latency_us: 50}
"""


def test_every_request_ends_once_on_a_decode_instance_after_one_leg_and_reruns_are_identical() -> None:
    first, second = _run(PD_TIME), _run(PD_TIME)
    requests = first.tables["requests"]
    legs = requests[requests["request_id"].str.endswith("@prefill")]
    clients = requests[~requests["request_id"].str.endswith("@prefill")]
    assert len(clients) == 40 and clients["request_id"].is_unique and set(clients["instance"]) == {1, 2}
    assert sorted(legs["request_id"]) == sorted(r + "@prefill" for r in clients["request_id"])
    assert set(legs["instance"]) == {0} and set(requests["outcome"]) == {"ok"}
    assert list(clients.groupby("instance").size()) == [20, 20]  # round robin over the decode instances
    joined = clients.merge(
        legs.assign(request_id=legs["request_id"].str.removesuffix("@prefill")), on="request_id", suffixes=("", "_leg")
    )
    assert len(joined) == 40
    assert (joined["first_token_s"] > joined["first_token_s_leg"]).all()
    assert (joined["local_hit_tokens"] + joined["external_hit_tokens"] == joined["prompt_tokens"] - 1).all()
    for name, table in first.tables.items():
        pd.testing.assert_frame_equal(table, second.tables[name])
    assert first.summary["requests"]["total"] == 40 and first.summary["pd"]["prefills"] == 40


@pytest.mark.parametrize(
    "instances, message",
    [
        ("[{role: prefill}, {}]", "cluster.instances.1.role: a cluster with prefill or decode instances has only"),
        ("[{role: prefill}, {role: prefill}]", "needs at least one decode instance"),
        ("[{role: decoder}, {role: prefill}]", "cluster.instances.0.role"),
    ],
)
def test_bad_roles_name_the_key(instances: str, message: str) -> None:
    text = ONE.replace("  instances: [{role: prefill}, {role: decode}]", f"  instances: {instances}")
    with pytest.raises(ScenarioError, match=message.replace("[", r"\[").replace(".", r"\.")):
        _run(text)


def test_a_pd_link_without_roles_and_an_own_connector_are_refused() -> None:
    with pytest.raises(ScenarioError, match=r"cluster\.pd: the P/D link needs prefill and decode instances"):
        _run(ONE.replace("[{role: prefill}, {role: decode}]", "2\n  pd: {bandwidth_gbps: 5}"))
    with pytest.raises(ScenarioError, match="prefill and decode instances use the P/D connector"):
        _run(ONE + "connector: {type: offload, capacity_gb: 1}\n")


def test_verify_refuses_a_pd_cluster_on_the_time_clock_in_one_line() -> None:
    """A P/D cluster is verified by replaying its recorded answers (tests/verify/test_cluster_replay.py); what
    its instances cannot verify is still refused, naming the instance."""
    from sim.verify.cluster import verify_cluster
    from sim.verify.run import VerifyStatus

    verdict = verify_cluster(
        scenario_from_text(ONE.replace("clock: steps", "clock: time\nhardware: {preset: h100-80g}"))
    )
    assert verdict.status is VerifyStatus.NOT_VERIFIABLE and verdict.reason.startswith("instance 0: clock: time")
    assert "\n" not in verdict.reason


def test_a_request_id_that_looks_like_a_leg_is_refused() -> None:
    with pytest.raises(ScenarioError, match="request id 'a@prefill' ends with '@prefill'"):
        _run(ONE.replace("{id: a,", "{id: a@prefill,"))


@pytest.mark.slow
@pytest.mark.parametrize(
    "name",
    [
        "mooncake-conversation-cluster-tier.yaml",
        "mooncake-conversation-cluster-pd.yaml",
        "mooncake-conversation-cluster-pd-tier.yaml",
    ],
)
def test_the_mooncake_cluster_scenarios_run_on_a_short_slice(name: str) -> None:
    """The docs/cluster.md scenarios, cut to their first 80 requests: every request finishes, once."""
    from pathlib import Path

    from sim.config import load_scenario

    root = Path(__file__).resolve().parents[2]
    if not (root / ".." / "shared" / "traces" / "mooncake_conversation_trace.jsonl").is_file():
        pytest.skip("the shared traces live next to the repo")
    result = sim.run_scenario(load_scenario(root / "scenarios" / name, overrides=["workload.limit=80"]), None)
    requests = result.tables["requests"]
    clients = requests[~requests["request_id"].str.endswith("@prefill")]
    assert len(clients) == 80 and clients["request_id"].is_unique and set(clients["outcome"]) == {"ok"}
    shape = name.removeprefix("mooncake-conversation-cluster-").removesuffix(".yaml").split("-")
    assert ("tier" in result.summary) == ("tier" in shape)
    assert ("pd" in result.summary) == ("pd" in shape)


def test_a_run_stopped_mid_prefill_still_accounts_every_request_once() -> None:
    """Stopped at step 8: requests whose leg had not finished are ``not_arrived`` on their decode instance,
    requests not yet arrived are routed nowhere, and none is lost or doubled."""
    from sim.api import RunOptions

    text = PD_TIME.replace("clock: time", "clock: steps").replace("rate: 6", "rate: 0.6")
    result = sim.run_scenario(scenario_from_text(text), None, options=RunOptions(max_steps=8))
    assert result.summary["status"] == "stopped"
    requests = result.tables["requests"]
    clients = requests[~requests["request_id"].str.endswith("@prefill")]
    assert len(clients) == 40 and clients["request_id"].is_unique
    assert set(clients.loc[clients["instance"] >= 0, "instance"]) <= {1, 2}
    waiting_on_a_leg = clients[(clients["instance"] >= 1) & (clients["outcome"] == "not_arrived")]
    assert len(waiting_on_a_leg) > 0 and (clients["instance"] == -1).sum() > 0


def test_explain_tells_a_leg_and_its_request_on_their_own_instances(tmp_path: Path) -> None:
    """``explain`` of a prefill leg (an id the workload does not hold: the leg has its request's prompt) and of
    its request on the decode instance, each with that instance's connector: the decode side's answer is the
    pulled prefill (where it said "not in the scenario's workload", and named no connector, before)."""
    bundle = tmp_path / "b"
    sim.run_scenario(scenario_from_text(ONE), bundle)
    leg = sim.api.explain_bundle(bundle, "a@prefill").fields()
    assert leg["instance"].startswith("0 (routed by round_robin")
    assert leg["connector"].startswith("remote: asked at 0, answered 0 tokens")
    decode = sim.api.explain_bundle(bundle, "a", attempt=1).fields()
    assert decode["instance"].startswith("1 (routed by round_robin")
    assert decode["connector"].startswith("remote: asked at 0, answered 3199 tokens")
