"""Prefix-boundary policies: the registry and vLLM 0.33's gate for PR #48425."""

from __future__ import annotations

import pytest

from sim.connector import ScriptedConnector
from sim.core.policy import (
    PR48425Policy,
    PrefixLookup,
    PrefixPolicy,
    ReconciledPolicy,
    get_prefix_policy,
    prefix_policy_names,
    register_prefix_policy,
)
from sim.core.request import Request
from sim.core.tokens import StreamSegment


class FakeKV:
    """Records which lookup the policy called; answers like a diverged FA > Mamba cache."""

    def __init__(self) -> None:
        self.calls: list[str] = []

    def get_computed_blocks(self, request):
        self.calls.append("get_computed_blocks")
        return ("reconciled-blocks", 16, 64)

    def get_computed_blocks_for_connector(self, request):
        self.calls.append("get_computed_blocks_for_connector")
        return ("fa-blocks", 64, 0, True)


def _req() -> Request:
    return Request("r", [StreamSegment("doc", 0, 80)], max_tokens=1)


def test_builtins_are_registered_and_sorted():
    names = prefix_policy_names()
    assert {"reconciled", "pr48425"} <= set(names)
    assert names == sorted(names)
    assert isinstance(get_prefix_policy("reconciled"), ReconciledPolicy)
    assert isinstance(get_prefix_policy("pr48425"), PR48425Policy)


def test_unknown_policy_names_the_key_and_valid_names():
    with pytest.raises(
        ValueError, match=r"scheduler.prefix_policy: unknown policy 'nope'; valid: .*pr48425.*reconciled"
    ):
        get_prefix_policy("nope")


def test_reconciled_ignores_the_connector():
    kv = FakeKV()
    got = ReconciledPolicy().lookup(kv, _req(), ScriptedConnector(supports_divergent_local_hybrid_hits=True))
    assert got == PrefixLookup("reconciled-blocks", 16, 64, False)
    assert kv.calls == ["get_computed_blocks"]


@pytest.mark.parametrize(
    "connector, expected_call, expected",
    [
        (None, "get_computed_blocks", PrefixLookup("reconciled-blocks", 16, 64, False)),
        (ScriptedConnector(), "get_computed_blocks", PrefixLookup("reconciled-blocks", 16, 64, False)),
        (
            ScriptedConnector(supports_divergent_local_hybrid_hits=True),
            "get_computed_blocks_for_connector",
            PrefixLookup("fa-blocks", 64, 0, True),
        ),
    ],
    ids=["no-connector", "connector-without-flag", "connector-with-flag"],
)
def test_pr48425_gate(connector, expected_call, expected):
    kv = FakeKV()
    assert PR48425Policy().lookup(kv, _req(), connector) == expected
    assert kv.calls == [expected_call]


def test_register_a_policy_and_reject_a_clash():
    class Half(PrefixPolicy):
        name = "test-half"

        def lookup(self, kv_manager, request, connector):
            blocks, hit, boundary = kv_manager.get_computed_blocks(request)
            return PrefixLookup(blocks, hit // 2, boundary)

    register_prefix_policy(Half)
    assert "test-half" in prefix_policy_names()
    assert get_prefix_policy("test-half").lookup(FakeKV(), _req(), None).local_tokens == 8

    class Other(PrefixPolicy):
        name = "test-half"

    with pytest.raises(ValueError, match="already registered"):
        register_prefix_policy(Other)


def test_only_the_policies_that_are_vllms_decisions_are_marked_verifiable():
    """``mirrors_vllm`` is what ``hybridsim verify`` reads: pr48425 is vLLM 0.33 as shipped,
    max_per_group the documented emulation of the pre-#48425 lookup; the rest are what-ifs
    or connector-blind variants that vLLM cannot be made to run."""
    from sim.core.policy.prefix import get_prefix_policy

    builtins = ("pr48425", "max_per_group", "reconciled", "trim_to_min", "pr48425_requery")
    marks = {name: get_prefix_policy(name).mirrors_vllm for name in builtins}
    assert marks == {
        "pr48425": True,
        "max_per_group": True,
        "reconciled": False,
        "trim_to_min": False,
        "pr48425_requery": False,
    }
    assert get_prefix_policy("pr48425_requery").requery_after_fallback
    assert not get_prefix_policy("pr48425").requery_after_fallback


def test_prefix_lookup_compares_by_value_and_refuses_other_types():
    """The scheduler's and the tests' comparisons of lookups are by value (as the frozen dataclass was)."""
    a = PrefixLookup("blocks", 16, 64, True)
    assert a == PrefixLookup("blocks", 16, 64, True)
    assert PrefixLookup("blocks", 16, 64) == PrefixLookup("blocks", 16, 64, False)
    for other in (
        PrefixLookup("other", 16, 64, True),
        PrefixLookup("blocks", 32, 64, True),
        PrefixLookup("blocks", 16, 0, True),
        PrefixLookup("blocks", 16, 64, False),
    ):
        assert a != other
    assert a != ("blocks", 16, 64, True)
    assert repr(a) == "PrefixLookup(blocks='blocks', local_tokens=16, shared_prefix_boundary=64, hit_diverged=True)"
