"""The simulator's speed mechanisms, above the core (none of them is a vLLM feature).

``sim.core`` is the plain mirror of vLLM's ``v1/core``; this package holds what
only makes it faster, as subclasses of core classes, chosen once by the
engine's build (:func:`sim.engine.build.build_components`, ``fast_paths``).
The core imports nothing from here. Every table a run writes is byte-identical
with and without these classes: ``tests/test_fastpath_differential.py`` is the
contract.

* :class:`~sim.accel.quiet.QuietKVCacheManager`: quiet horizons around
  ``allocate_slots`` (most running-loop calls give a request a few more tokens
  inside blocks it already holds; the per-group steps then change nothing).
"""

from sim.accel.quiet import QuietHorizons, QuietKVCacheManager, quiet_horizon

__all__ = ["QuietHorizons", "QuietKVCacheManager", "quiet_horizon"]
