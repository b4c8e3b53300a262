"""Fixtures for the verify tests: the vLLM side is optional.

Tests that need vLLM take the ``vllm`` fixture: without an importable vLLM
0.33 they are skipped, unless ``HYBRIDSIM_REQUIRE_VLLM=1`` (CI after
``make vllm-env``), in which case they fail.
"""

from __future__ import annotations

import os

import pytest

from sim.verify import vllm_side


@pytest.fixture(scope="session")
def vllm() -> None:
    try:
        vllm_side._load_vllm()
    except vllm_side.VllmMissing as exc:
        if os.environ.get("HYBRIDSIM_REQUIRE_VLLM") == "1":
            pytest.fail(f"HYBRIDSIM_REQUIRE_VLLM=1 but vLLM is not importable: {exc}")
        pytest.skip(f"vLLM 0.33 not installed ({exc}); `make vllm-env` installs it")
