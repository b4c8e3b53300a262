"""Plots and reports drawn from finished results (on top of :mod:`sim.results`); see docs/results.md."""
