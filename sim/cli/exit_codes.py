"""The one table of the ``hybridsim`` command's exit codes (docs/cli.md lists the same table).

Every command exits with one of these; a lower layer reports an outcome (a run's status, a verification's
verdict) and the command maps it here, so a number means one thing across commands.
"""

from __future__ import annotations

from enum import IntEnum


class ExitCode(IntEnum):
    """Exit codes of ``hybridsim``; the values are a contract with users' scripts and CI."""

    #: Success (``trace diff`` and ``verify``: identical).
    OK = 0
    #: ``trace diff``/``verify`` found a difference; ``replay`` did not reproduce the crash.
    DIFF = 1
    #: Any command: the result bundle could not be written (disk full, I/O error; the previous bundle is
    #: untouched). The same number as ``DIFF`` (an alias), as it always was.
    WRITE_FAILED = 1
    #: Bad input: a scenario, trace, override or path that cannot be used (one line on stderr naming it).
    BAD_INPUT = 2
    #: The run crashed and ``on_crash: stop`` stopped it (the bundle and ``crash.json`` are written).
    CRASH = 3
    #: ``--check-invariants`` found a broken invariant (the bundle is written and marked partial).
    INVARIANT = 4
    #: The run stalled (requests left that can never be scheduled).
    STALLED = 5
    #: ``sweep``: some runs failed (each is recorded with its error in the sweep's table).
    SWEEP_FAILURES = 6
    #: ``verify``: a scenario hybridsim cannot compare with vLLM (a what-if policy, the time clock, ...).
    NOT_VERIFIABLE = 7
    #: Interrupted (Ctrl-C or SIGTERM); bundles are whole, marked partial, or not written at all.
    INTERRUPTED = 130


#: How a run ended (``RunResult.status``, ``summary.json``'s ``status``) -> the exit code it implies. A run
#: stopped at its step limit (``stopped``) ran as asked: success.
RUN_STATUS_EXIT: dict[str, ExitCode] = {
    "complete": ExitCode.OK,
    "stopped": ExitCode.OK,
    "crashed": ExitCode.CRASH,
    "invariant_violation": ExitCode.INVARIANT,
    "stalled": ExitCode.STALLED,
    "interrupted": ExitCode.INTERRUPTED,
}
