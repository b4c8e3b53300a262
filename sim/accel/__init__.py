"""The simulator's speed mechanisms, above the core (none of them is a vLLM feature).

``sim.core`` is the plain mirror of vLLM's ``v1/core``; this package holds what
only makes it faster, as subclasses of core classes, chosen once by the
engine's build (:func:`sim.engine.build.build_components`, ``fast_paths``).
The core imports nothing from here. Every table a run writes is byte-identical
with and without these classes: ``tests/test_fastpath_differential.py`` is the
contract.

* :class:`~sim.accel.counters.CountingKVCacheManager`: the pool and the single-type managers keep the
  steps table's per-group held blocks and cache entries as counters (the core counts them when asked);
  every manager below is one.
* :class:`~sim.accel.quiet.QuietKVCacheManager`: quiet horizons around
  ``allocate_slots`` (most running-loop calls give a request a few more tokens
  inside blocks it already holds; the per-group steps then change nothing).
* :class:`~sim.accel.replicas.ReplicaCoordinator`: identical align-mode Mamba groups (Nemotron-H has six)
  decide each request's skip, count, allocation, caching and free once, on the first of them; the others
  (:class:`~sim.accel.replicas.MambaFollower`) apply that decision to their own tables and blocks, in their
  place in the group order (built by the manager above where the layout has them).
* :class:`~sim.accel.decodes.QuietDecodeScheduler`: the running loop schedules a
  decode inside its quiet horizon without the chunk computation and the
  ``allocate_slots`` call (built together with the manager above);
  ``_update_after_schedule`` with each run of quiet decodes in bulk, ``update_from_output`` in one pass.
* :class:`~sim.accel.lookups.HeadOfLineLookups`: a waiting request that was
  not admitted keeps its prefix lookup until a prefix-cache event names one of
  its hashes (the manager above shows it every event; the scheduler above
  reuses it).
* :class:`~sim.accel.hashing.SharedPrefixBlockHasher`: a prompt's blocks inside a
  start it shares with an earlier prompt take that prompt's hashes; output blocks
  are hashed straight from the output stream (with any layout).
* :func:`~sim.accel.stretch.quiet_steps` / :func:`~sim.accel.stretch.take_quiet_steps`:
  how many of the next steps are quiet decodes of every running request, and
  taking them at once (the engine loop ``sim.engine.stretch.StretchLoop``, of a
  single engine or of a cluster instance, takes such a stretch as one event).
"""

from sim.accel.counters import CountingKVCacheManager
from sim.accel.decodes import QuietDecodeScheduler
from sim.accel.hashing import SharedPrefixBlockHasher
from sim.accel.lookups import HeadOfLineLookups
from sim.accel.quiet import QuietHorizons, QuietKVCacheManager, quiet_horizon
from sim.accel.replicas import MambaFollower, ReplicaCoordinator

__all__ = [
    "CountingKVCacheManager",
    "HeadOfLineLookups",
    "MambaFollower",
    "QuietDecodeScheduler",
    "QuietHorizons",
    "QuietKVCacheManager",
    "ReplicaCoordinator",
    "SharedPrefixBlockHasher",
    "quiet_horizon",
]
