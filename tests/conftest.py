"""Suite-wide set-up.

The suite runs the interpreted core even where a compiled build exists
(``HYBRIDSIM_NATIVE=0``, read when ``sim`` is first imported, see
:mod:`sim.native`): some tests wrap core methods to count calls, which compiled
classes refuse. The compiled build is held to the interpreted one by
``tests/native/test_native_differential.py``, in subprocesses of its own.

Tests that need the real vLLM take the ``vllm`` fixture: without an importable
vLLM 0.33 they are skipped, unless ``HYBRIDSIM_REQUIRE_VLLM=1`` (CI after
``make vllm-env``), in which case they fail.
"""

from __future__ import annotations

import os

import pytest

os.environ.setdefault("HYBRIDSIM_NATIVE", "0")


@pytest.fixture(scope="session")
def vllm() -> None:
    from sim.verify import vllm_side

    try:
        vllm_side._load_vllm()
    except vllm_side.VllmMissing as exc:
        if os.environ.get("HYBRIDSIM_REQUIRE_VLLM") == "1":
            pytest.fail(f"HYBRIDSIM_REQUIRE_VLLM=1 but vLLM is not importable: {exc}")
        pytest.skip(f"vLLM 0.33 not installed ({exc}); `make vllm-env` installs it")


@pytest.fixture
def extra_plugins(monkeypatch):
    """One extra plug-in of each kind (connector, prefix, eviction and checkpoint policy) installed through its
    entry point for the test's duration (tests/support/registries.py)."""
    from support.registries import extra_plugins

    yield from extra_plugins(monkeypatch)
