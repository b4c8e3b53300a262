"""The end-to-end fuzz (``hybridsim fuzz --e2e``): random scenarios through the whole user path.

:mod:`sim.e2e.scenarios` draws the scenarios, :mod:`sim.e2e.path` walks one through the commands and
checks each, :mod:`sim.e2e.driver` runs many and writes every failure out as a scenario plus the command
that failed (docs/fuzz.md). It sits at the command layer: it drives the ``hybridsim`` command itself.
"""
