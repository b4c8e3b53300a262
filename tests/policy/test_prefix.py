"""Prefix-boundary policies: the registry and vLLM 0.33's gate for PR #48425."""

from __future__ import annotations

import pytest

from sim.connector import ScriptedConnector
from sim.policy import (
    PR48425Policy,
    PrefixLookup,
    PrefixPolicy,
    ReconciledPolicy,
    get_prefix_policy,
    prefix_policy_names,
    register_prefix_policy,
)
from sim.request import Request
from sim.tokens import StreamSegment


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
    with pytest.raises(ValueError, match=r"scheduler.prefix_policy: unknown policy 'nope'; valid: .*pr48425.*reconciled"):
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
