"""The ``hybridsim`` console script and ``python -m sim``: SIGINT/SIGTERM handled from hybridsim's first line.

Importing the command line (typer, rich, the command modules) takes about half a second to a few seconds on a
loaded machine. Without a handler a SIGTERM in that time killed the process by the default action (exit 143,
no message; SIGINT printed a traceback). This module imports only :mod:`sim.interrupts` (standard library)
before it installs the one handler, and imports the command line under it. A signal while starting up exits
130 with one line (``error: interrupted (SIGTERM) while starting; nothing was written``): no command has
begun, so every output, an existing bundle included, is as it was. From the command on, its own handling
(:func:`sim.cli.errors.handles_errors`) takes over under the same handler: there is no moment without one.

Left unguarded: the interpreter's own start-up before this module runs (tens of milliseconds), and typer's
argument parsing (milliseconds; click turns a signal there into ``Aborted!``, exit 1).

The cyclic garbage collector (docs/speed.md): importing the command line builds tens of thousands of objects
that live as long as the process (modules, classes, typer's parameters) and no cyclic garbage; the collector
is off while it is imported, and what it built is frozen (left out of every later collection):
:func:`sim.startup.long_lived`, which the commands use again for their own imports and the scenario's
validators. At exit, whatever is still alive is frozen too: the interpreter's final collection would otherwise
walk the whole heap (the modules, a run's result) only to find it all reachable, a tenth of ``validate``'s CPU.
Frozen objects are still freed by reference counting as the interpreter tears the modules down; only cyclic
garbage still alive at exit is left to the operating system, as all memory is. The commands that ask for it
(``run``, ``validate``, the help page: :func:`sim.startup.end_quickly`) skip that teardown altogether: once
they return, the exit handlers run, the standard streams are flushed and the process ends.

BLAS threads: numpy's and scipy's wheels bring OpenBLAS, which starts one thread per core when numpy is
imported, and those threads spin while they wait for work that hybridsim never gives them (it does no
large linear algebra; the timing fit's least squares has a handful of parameters). On this project's
2-core machine that was 0.12 s of CPU in every command that imports numpy (``validate`` 0.34 -> 0.23 s,
``run`` of a 1000-request workload 0.68 -> 0.56 s). :func:`limit_blas_threads` asks for one thread unless
the user set ``OPENBLAS_NUM_THREADS`` themselves.

Arrow's memory: pyarrow allocates through mimalloc by default, which keeps what it freed and reserves address
space ahead (a 100k-request Mooncake replay: about 1.8 GB of address space for 0.6 GB resident, and 0.25 GB
more resident after its bundle was written). :func:`use_system_arrow_pool` asks for the C library's allocator
unless the user set ``ARROW_DEFAULT_MEMORY_POOL`` themselves (docs/limits.md, "Memory of a long run").
"""

from __future__ import annotations

import atexit
import gc
import os
import sys

from sim.interrupts import interrupts_raise, pause_point
from sim.startup import ends_quickly, long_lived, quick_exit

#: ``sim.cli.exit_codes.ExitCode.INTERRUPTED``: importing it here would load the whole command line first
#: (tests/test_entry.py keeps the two equal).
INTERRUPTED = 130


def limit_blas_threads() -> None:
    """One OpenBLAS thread unless ``OPENBLAS_NUM_THREADS`` is already set (module docstring); must run before
    numpy is first imported, which is when OpenBLAS reads it."""
    os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")


def use_system_arrow_pool() -> None:
    """Arrow allocates through the C library unless ``ARROW_DEFAULT_MEMORY_POOL`` is already set (module
    docstring); must run before pyarrow is first imported, which is when it reads it."""
    os.environ.setdefault("ARROW_DEFAULT_MEMORY_POOL", "system")


def main() -> None:
    """Run the ``hybridsim`` command line with the signal handler installed before it is imported."""
    limit_blas_threads()
    use_system_arrow_pool()
    atexit.register(gc.freeze)  # runs last of the exit handlers: registered before any other of hybridsim's
    try:
        with interrupts_raise():
            pause_point("start")  # the start-up window, for tests/trace/test_atomic.py
            with long_lived():
                from sim.cli import main as cli_main

            cli_main()
    except KeyboardInterrupt as exc:
        sys.stderr.write(f"error: {exc or 'interrupted'} while starting; nothing was written\n")
        sys.exit(INTERRUPTED)
    except SystemExit as exc:  # how the command line always ends (typer exits with the command's code)
        if ends_quickly():
            quick_exit(exc.code)  # returns when the interpreter's own exit could differ
        raise
