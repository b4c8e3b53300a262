"""The ``multi`` connector (vLLM ``MultiConnector``'s rules): the first non-zero child serves a load, a ``None``
stops the lookup, every child sees every allocation and finish, a free waits for every delaying child, and bad
options name the key."""

from __future__ import annotations

from typing import Any

import pytest

from sim.config import ScenarioError, scenario_from_text
from sim.connector import create_connector
from sim.connector.base import KVConnector
from sim.connector.multi import MultiConnector, connector_part
from sim.connector.offload import OffloadConnector
from sim.connector.remote import RemoteConnector
from sim.core.request import Request, StreamSegment


class Child(KVConnector):
    """Answers what it is told and logs every call."""

    def __init__(self, name: str, answer: int | None, delay: bool = False, params: dict[str, Any] | None = None):
        self.name = name  # type: ignore[misc]
        self.answer = answer
        self.delay = delay
        self.params = params
        self.calls: list[tuple[Any, ...]] = []
        self.sent: set[str] = set()
        self.supplies_mamba_state = name != "no_state"

    def get_num_new_matched_tokens(self, request: Request, num_computed_tokens: int) -> tuple[int | None, bool]:
        self.calls.append(("lookup", request.request_id))
        return self.answer, bool(self.answer)

    def update_state_after_alloc(self, request: Request, blocks: Any, num_external_tokens: int) -> None:
        self.calls.append(("alloc", request.request_id, num_external_tokens))

    def request_finished_all_groups(self, request: Request, block_ids: Any) -> tuple[bool, Any]:
        self.calls.append(("finished", request.request_id))
        return self.delay, self.params

    def get_finished(self) -> tuple[set[str], set[str]]:
        sent, self.sent = self.sent, set()
        return set(), sent


def _request(rid: str = "r") -> Request:
    return Request(rid, [StreamSegment("doc", 0, 100)], max_tokens=4, arrival_time=0.0, output_len=2)


def test_the_first_child_with_a_non_zero_count_serves_the_load_and_every_child_is_asked() -> None:
    a, b, c = Child("a", 0), Child("b", 32), Child("c", 64)
    multi = MultiConnector([a, b, c])
    r = _request()
    assert multi.get_num_new_matched_tokens(r, 0) == (32, True)
    assert [x.calls for x in (a, b, c)] == [[("lookup", "r")]] * 3
    multi.update_state_after_alloc(r, ([],), 32)
    assert (a.calls[-1], b.calls[-1], c.calls[-1]) == (("alloc", "r", 0), ("alloc", "r", 32), ("alloc", "r", 0))
    assert multi.peek_num_new_matched_tokens(r, 0) is None  # these children cannot answer hypothetically


def test_a_not_ready_child_stops_the_lookup_and_no_answer_loads_nothing() -> None:
    a, b, c = Child("a", 0), Child("b", None), Child("c", 64)
    multi = MultiConnector([a, b, c])
    assert multi.get_num_new_matched_tokens(_request(), 0) == (None, False)
    assert c.calls == []
    b.answer, c.answer = 0, 0
    r = _request("s")
    assert multi.get_num_new_matched_tokens(r, 0) == (0, False)
    multi.update_state_after_alloc(r, ([],), 0)
    assert [x.calls[-1] for x in (a, b, c)] == [("alloc", "s", 0)] * 3


def test_what_a_load_writes_is_the_serving_childs() -> None:
    nixl, tier = Child("pull", 0), Child("no_state", 32)
    multi = MultiConnector([nixl, tier])
    multi.get_num_new_matched_tokens(_request(), 0)
    assert multi.supplies_mamba_state is False
    nixl.answer = 16
    multi.get_num_new_matched_tokens(_request(), 0)
    assert multi.supplies_mamba_state is True


@pytest.mark.parametrize("delaying", [(True, False), (False, True), (True, True)])
def test_blocks_stay_until_every_delaying_child_sent_them(delaying: tuple[bool, bool]) -> None:
    a, b = Child("a", 0, delay=delaying[0]), Child("b", 0, delay=delaying[1])
    multi = MultiConnector([a, b])
    r = _request()
    assert multi.request_finished_all_groups(r, ([],)) == (True, None)
    assert a.calls == b.calls == [("finished", "r")]
    first, second = [c for c, d in zip((a, b), delaying) if d] + [None] * (2 - sum(delaying))
    assert first is not None
    first.sent.add("r")
    sent = multi.get_finished()[1]
    if second is None:
        assert sent == {"r"}
        return
    assert sent == set()  # one child still sends
    second.sent.add("r")
    assert multi.get_finished()[1] == {"r"}


def test_no_delaying_child_frees_at_once_and_params_merge_or_clash() -> None:
    multi = MultiConnector([Child("a", 0, params={"x": 1}), Child("b", 0, params={"y": 2})])
    assert multi.request_finished_all_groups(_request(), ([],)) == (False, {"x": 1, "y": 2})
    clash = MultiConnector([Child("a", 0, params={"x": 1}), Child("b", 0, params={"x": 2})])
    with pytest.raises(RuntimeError, match="Key clash"):
        clash.request_finished_all_groups(_request(), ([],))


class Counting(Child):
    def metrics(self) -> dict[str, Any]:
        return {"loads": 2, "bytes_loaded": 10, "queries": 7}

    def step_columns(self) -> dict[str, Any]:
        return {"conn_loads_in_flight": 1, f"conn_{self.name}": 3}


def test_metrics_sum_loads_keep_each_childs_under_its_type_and_columns_add_up() -> None:
    multi = MultiConnector([Counting("a", 0), Counting("b", 16)])
    multi.get_num_new_matched_tokens(_request(), 0)
    multi.get_num_new_matched_tokens(_request(), 0)
    m = multi.metrics()
    assert (m["queries"], m["hit_tokens"], m["loads"], m["bytes_loaded"]) == (2, 32, 4, 20)
    assert (m["a.queries"], m["b.loads"]) == (7, 2) and "stores" not in m
    assert multi.step_columns() == {"conn_loads_in_flight": 2, "conn_a": 3, "conn_b": 3}


def test_parts_and_children_built_from_options() -> None:
    multi = create_connector("multi", connectors=[{"type": "remote"}, {"type": "offload", "capacity_gb": 1}])
    assert isinstance(multi, MultiConnector)
    assert isinstance(connector_part(multi, RemoteConnector), RemoteConnector)
    assert isinstance(connector_part(multi, OffloadConnector), OffloadConnector)
    assert connector_part(OffloadConnector(capacity_gb=1), RemoteConnector) is None
    assert multi.supports_divergent_local_hybrid_hits is False  # offload does not, so the composite does not


BASE = """
name: multi
clock: steps
cache: {block_size: 16, num_blocks: 40, groups: [full_attention, mamba]}
workload:
  requests:
    - {id: a, at: 0, output_len: 3, max_tokens: 3, prompt: [{content: doc, tokens: 100}]}
"""


@pytest.mark.parametrize(
    "connector, message",
    [
        ("{type: multi}", "connector.connectors: multi needs a non-empty list"),
        ("{type: multi, connectors: []}", "connector.connectors: multi needs a non-empty list"),
        ("{type: multi, connectors: [remote]}", "connector.connectors.0: expected a connector mapping"),
        (
            "{type: multi, connectors: [{type: remot}]}",
            "connector.connectors.0: connector.type: unknown connector 'remot'",
        ),
        ("{type: multi, connectors: [{type: offload}]}", "connector.connectors.0: connector.capacity_gb"),
        (
            "{type: multi, connectors: [{type: remote}, {type: remote}]}",
            "connector.connectors.1.type: 'remote' is listed twice",
        ),
        (
            "{type: multi, connectors: [{type: multi, connectors: [{type: remote}]}]}",
            "connector.connectors.0.type: 'multi' cannot be nested",
        ),
    ],
)
def test_bad_children_name_the_key(connector: str, message: str) -> None:
    import sim

    with pytest.raises(ScenarioError, match=message.replace("[", r"\[").replace(".", r"\.")):
        sim.run_scenario(scenario_from_text(BASE + f"connector: {connector}\n"), None)


def test_one_child_decides_as_that_child_alone() -> None:
    """A ``multi`` of one ``offload`` gives the same tables as the ``offload`` connector itself."""
    import pandas as pd

    import sim

    text = BASE.replace("num_blocks: 40", "num_blocks: 24").replace(
        "workload:\n  requests:\n    - {id: a, at: 0, output_len: 3, max_tokens: 3, prompt: [{content: doc, tokens: 100}]}\n",
        "workload:\n  generator:\n    arrivals: {process: poisson, rate: 2}\n    count: 40\n"
        "    structure: {kind: shared_system, system: {num_prompts: 2, length: {dist: uniform, low: 60, high: 200}},"
        " user_len: {dist: lognormal, mean: 40, sigma: 0.5}}\n    output: {dist: uniform, low: 2, high: 30}\n",
    )
    offload = "{type: offload, capacity_gb: 0.01, chunk_tokens: 32}"
    alone = sim.run_scenario(scenario_from_text(text + f"connector: {offload}\n"), None)
    wrapped = sim.run_scenario(
        scenario_from_text(text + f"connector: {{type: multi, connectors: [{offload}]}}\n"), None
    )
    assert alone.summary["connector_metrics"]["loads"] > 0
    for name in ("requests", "admissions", "kv_events"):
        pd.testing.assert_frame_equal(alone.tables[name], wrapped.tables[name])
