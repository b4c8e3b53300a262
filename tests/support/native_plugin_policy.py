"""Worker of the native plugin-policy test: interpreted prefix policies on whichever core this process runs.

Usage: ``python native_plugin_policy.py SCENARIO``. Registers two policies defined
here, in interpreted Python: one subclassing the base :class:`PrefixPolicy`
directly, one subclassing the built-in :class:`PR48425Policy` and delegating to
it through ``super()``. Runs ``SCENARIO`` under each and prints, as JSON, a
fingerprint of every table per policy, how often each policy's ``lookup`` ran,
and which listed modules came from their extensions (``HYBRIDSIM_NATIVE``
chooses the build).
"""

from __future__ import annotations

import json
import sys
from typing import Any

from native_run import fingerprint_result

from sim.core.policy.prefix import PR48425Policy, PrefixLookup, PrefixPolicy, register_prefix_policy

CALLS = {"test-plugin-base": 0, "test-plugin-pr48425": 0}


class BasePlugin(PrefixPolicy):
    """The reconciled lookup, written against the base class."""

    name = "test-plugin-base"

    def lookup(self, kv_manager: Any, request: Any, connector: Any | None) -> PrefixLookup:
        CALLS[self.name] += 1
        blocks, hit, boundary = kv_manager.get_computed_blocks(request)
        return PrefixLookup(blocks, hit, boundary)


class DelegatingPlugin(PR48425Policy):
    """vLLM 0.33's lookup, reached through ``super()`` from an interpreted subclass."""

    name = "test-plugin-pr48425"

    def lookup(self, kv_manager: Any, request: Any, connector: Any | None) -> PrefixLookup:
        CALLS[self.name] += 1
        return super().lookup(kv_manager, request, connector)


def main(scenario: str) -> None:
    from sim import native
    from sim.api import RunOptions, run_scenario
    from sim.config import load_scenario

    register_prefix_policy(BasePlugin)
    register_prefix_policy(DelegatingPlugin)
    runs = {}
    for name in CALLS:
        loaded = load_scenario(scenario, ["outputs.plots=false", f"scheduler.prefix_policy={name}"])
        runs[name] = fingerprint_result(run_scenario(loaded, None, options=RunOptions(write_plots=False)))
    json.dump({"compiled": native.compiled_modules_loaded(), "calls": CALLS, "runs": runs}, sys.stdout)


if __name__ == "__main__":
    main(sys.argv[1])
