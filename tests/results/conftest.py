"""The hand-made run's tables as the ``tables`` fixture (shared with tests/analysis)."""

from support.hand_tables import tables  # noqa: F401  (a pytest fixture)
