"""The pure core: vLLM 0.33's scheduler and KV-cache manager, block by block.

Invariants (checked by ``tests/test_import_contract.py``): nothing here imports
from outside ``sim.core`` (no engine, trace, analysis, cli or sweep), and no
simpy, pandas or matplotlib. No clock: every method is a pure step function of
its inputs, so the same requests in the same order give the same decisions.

* ``tokens``, ``request``: prompt token streams and the request state machine;
* ``kv``: the block pool, the per-type managers and the coordinator;
* ``scheduler``: the v1 scheduler loop, one ``schedule()`` per step;
* ``policy``: prefix-boundary and eviction policies;
* ``admission_truth``: the checker that classifies each admission;
* ``interfaces``: the Protocols at the core's seams;
* ``registry``: named policies and connectors.
"""
