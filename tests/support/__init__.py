"""Shared test harnesses and fixtures (importable as ``support.*``; ``tests/`` is on pytest's pythonpath)."""
