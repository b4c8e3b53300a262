"""The step-time model against GPU kernel profiles: load (``profiles``), compare (``check``), fit (``fit``), CLI (``cli``)."""
