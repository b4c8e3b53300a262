"""Arrivals a connector routes first (``route_arrival``): the P/D proxy of the ``remote`` connector.

vLLM's decode instance sees a remote-prefilled request only once the prefill instance is done with it, so its
scheduler never asks the connector about a request still in prefill and its FCFS order is the order in which
prefills finish. hybridsim's engine holds a routed request back until the connector hands it over.
"""

from __future__ import annotations

from sim.api import RunOptions, run_scenario
from sim.config.scenario import Scenario


def _scenario(clock: str, requests: list[dict], connector: dict) -> Scenario:
    data: dict = {
        "name": "routed",
        "clock": clock,
        "connector": connector,
        "workload": {"requests": requests},
        "outputs": {"plots": False},
    }
    if clock == "steps":
        data["cache"] = {"block_size": 16, "num_blocks": 200, "groups": ["full_attention", "mamba"]}
    else:
        data |= {"model": {"preset": "nemotron-h-8b"}, "hardware": {"preset": "h100-80g"}}
        data["cache"] = {"num_blocks": 400}
    return Scenario.model_validate(data)


def _req(rid: str, at: float, tokens: int) -> dict:
    return {"id": rid, "at": at, "prompt": [{"content": rid, "tokens": tokens}], "max_tokens": 2}


def _run(scenario: Scenario):
    return run_scenario(scenario, None, options=RunOptions(write_plots=False, progress=False))


def test_the_scheduler_is_never_asked_about_a_request_in_prefill() -> None:
    """Eight requests at step 0, each prefilled for 6 steps: no attempt before step 6, no `connector_not_ready`,
    one connector query per admission, and the steps table counts none of them waiting before then."""
    requests = [_req(f"r{i}", 0, 64) for i in range(8)]
    result = _run(_scenario("steps", requests, {"type": "remote", "prefill_steps": 6}))
    admissions, steps = result.tables["admissions"], result.tables["steps"]
    first = admissions[admissions["kind"] == "first"]
    assert sorted(first["request_id"]) == [f"r{i}" for i in range(8)]
    assert set(first["step"]) == {6} and (first["outcome"] == "ok").all()
    assert not (admissions["reason"] == "connector_not_ready").any()
    assert result.summary["connector_metrics"]["queries"] == len(first)
    assert (steps.loc[steps["step"] < 6, "waiting"] == 0).all()
    assert (result.tables["requests"]["outcome"] == "ok").all()


def test_fcfs_order_at_the_decode_instance_is_prefill_completion_order() -> None:
    """On the time clock the prefill instance shares its throughput: a short prompt arriving after a long one
    is prefilled first, so it reaches the decode scheduler (and is admitted) first; TTFT still counts from the
    client's arrival."""
    requests = [_req("long", 0.0, 8000), _req("short", 0.001, 200)]
    result = _run(_scenario("time", requests, {"type": "remote"}))
    first = result.tables["admissions"]
    first = first[first["kind"] == "first"]
    assert list(first["request_id"]) == ["short", "long"]
    rows = result.tables["requests"].set_index("request_id")
    assert rows.loc["long", "arrival_s"] == 0.0
    # The long prompt's first token comes after its whole remote prefill (8000 tokens at 20k tokens/s).
    assert rows.loc["long", "first_token_s"] > 7999 / 20_000


def test_a_request_the_connector_does_not_route_goes_straight_to_the_scheduler() -> None:
    requests = [_req("local", 0, 64), _req("remote", 0, 64)]
    result = _run(_scenario("steps", requests, {"type": "remote", "requests": ["remote"], "prefill_steps": 3}))
    first = result.tables["admissions"]
    first = first[first["kind"] == "first"].set_index("request_id")
    assert (first.loc["local", "step"], first.loc["local", "external_tokens"]) == (0, 0)
    assert (first.loc["remote", "step"], first.loc["remote", "external_tokens"]) == (3, 63)


def test_a_faulty_wrapper_routes_through_its_inner_connector_and_slows_the_prefill() -> None:
    requests = [_req("r", 0, 64)]
    connector = {"type": "faulty", "wraps": {"type": "remote", "prefill_steps": 2}, "slow": {"r": 3}}
    result = _run(_scenario("steps", requests, connector))
    first = result.tables["admissions"]
    assert list(first.loc[first["kind"] == "first", "step"]) == [6]  # ceil(2 * 3) steps of prefill
    assert result.summary["connector_metrics"]["fault_slow_requests"] == 1
