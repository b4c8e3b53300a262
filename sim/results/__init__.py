"""The results layer: a finished run's tables and summary (above the engine, below analysis).

``finalize(record) -> RunResult`` (stage 3) and ``write_bundle(result, dir)``
(stage 4); see docs/architecture.md.
"""

from sim.results.finalize import RunResult, finalize
from sim.results.write import write_bundle

__all__ = ["RunResult", "finalize", "write_bundle"]
