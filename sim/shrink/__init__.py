"""``hybridsim shrink``: delta debugging over a scenario while it keeps a property (see :mod:`sim.shrink.driver`)."""

from sim.shrink.driver import ShrinkResult, shrink
from sim.shrink.property import KEEP_CHOICES, ShrinkError

__all__ = ["KEEP_CHOICES", "ShrinkError", "ShrinkResult", "shrink"]
