"""Suite-wide set-up.

The suite runs the interpreted core even where a compiled build exists
(``HYBRIDSIM_NATIVE=0``, read when ``sim`` is first imported, see
:mod:`sim.native`): some tests wrap core methods to count calls, which compiled
classes refuse. The compiled build is held to the interpreted one by
``tests/native/test_native_differential.py``, in subprocesses of its own.
"""

from __future__ import annotations

import os

os.environ.setdefault("HYBRIDSIM_NATIVE", "0")
