"""Suite-wide set-up.

Tests that need the real vLLM take the ``vllm`` fixture, the installed release
(``"0.33"`` or ``"0.34"``): without an importable vLLM they are skipped, unless
``HYBRIDSIM_REQUIRE_VLLM=1`` (CI after ``make vllm-env``), in which case they
fail. Every such test is also marked ``vllm``, so that CI can run just them
again against the other release (``pytest -m vllm``, .ci/run).
"""

from __future__ import annotations

import os

import pytest


@pytest.fixture(scope="session")
def vllm() -> str:
    """The installed vLLM's release (skip, or fail under ``HYBRIDSIM_REQUIRE_VLLM=1``, without one)."""
    from sim.verify import vllm_side

    try:
        return vllm_side.installed_release()
    except vllm_side.VllmMissing as exc:
        if os.environ.get("HYBRIDSIM_REQUIRE_VLLM") == "1":
            pytest.fail(f"HYBRIDSIM_REQUIRE_VLLM=1 but vLLM is not importable: {exc}")
        pytest.skip(f"vLLM not installed ({exc}); `make vllm-env` installs it")


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Mark every test that takes the ``vllm`` fixture ``vllm`` (the differential tests CI reruns per release)."""
    for item in items:
        if "vllm" in getattr(item, "fixturenames", ()):
            item.add_marker(pytest.mark.vllm)


@pytest.fixture
def extra_plugins(monkeypatch):
    """One extra plug-in of each kind (connector, prefix, eviction and checkpoint policy) installed through its
    entry point for the test's duration (tests/support/registries.py)."""
    from support.registries import extra_plugins

    yield from extra_plugins(monkeypatch)
