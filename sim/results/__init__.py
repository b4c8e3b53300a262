"""The results layer: a finished run's tables and summary (below analysis, above the engine)."""
