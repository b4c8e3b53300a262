"""Metrics and plots computed from the result tables (DESIGN.md §6); see docs/results.md."""

from sim.analysis.metrics import request_metrics, run_summary

__all__ = ["request_metrics", "run_summary"]
