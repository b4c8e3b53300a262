"""How a command fails: one line on stderr and an :class:`~sim.cli.exit_codes.ExitCode` (``--debug``: the
traceback too). Known bad-input errors are exit 2, an unwritable bundle exit 1, SIGINT/SIGTERM exit 130."""

from __future__ import annotations

import contextlib
import functools
import traceback
from pathlib import Path
from typing import Any, Callable, Iterator, NoReturn, TypeVar

import typer

from sim.cli.exit_codes import ExitCode

_state = {"debug": False}

F = TypeVar("F", bound=Callable[..., Any])


def set_debug(debug: bool) -> None:
    """``--debug``: print tracebacks of the errors turned into one line."""
    _state["debug"] = debug


def fail(message: str, code: int = ExitCode.BAD_INPUT) -> NoReturn:
    """Print ``error: message`` on stderr and exit with ``code``."""
    from sim.cli.output import terminal_text

    typer.echo(f"error: {terminal_text(message, keep_newlines=False)}", err=True)
    raise typer.Exit(int(code))


#: The operating system's errors that are bad input (a file named on the command line that is missing, a folder
#: where a file should be, ...): one line with the reason and the file name. The simulator's own bad-input errors
#: (ScenarioError, WorkloadError, TraceDiffError, SweepError) are ValueErrors, one line each like any ValueError,
#: so their modules are not imported to catch them (sim.trace.diff imports pandas: 0.3 s of a failing command).
_BAD_INPUT_OS_ERRORS: tuple[type[OSError], ...] = (
    FileNotFoundError,
    PermissionError,
    NotADirectoryError,
    IsADirectoryError,
    FileExistsError,
)


@contextlib.contextmanager
def naming_file(path: Path) -> Iterator[None]:
    """Prefix a build-time bad-input error (which names only the key) with the scenario file."""
    from sim.config import ScenarioError
    from sim.workload.errors import WorkloadError

    try:
        yield
    except (ScenarioError, WorkloadError) as exc:
        if str(exc).startswith(str(path)):
            raise
        raise ScenarioError(f"{path}: {exc}") from exc


def _traceback_if_debug() -> None:
    if _state["debug"]:
        traceback.print_exc()


def handles_errors(fn: F) -> F:
    """Turn known bad-input errors into one line + exit 2 (``--debug``: traceback); a bundle or file that
    cannot be written (disk full, read-only file system) into one line + exit 1; SIGINT/SIGTERM into one line + exit 130."""
    from sim.interrupts import interrupts_raise
    from sim.trace.output import OutputWriteError

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            with interrupts_raise():
                return fn(*args, **kwargs)
        except typer.Exit:
            raise
        except KeyboardInterrupt as exc:
            fail(f"{exc or 'interrupted'}; output folders hold whole bundles only (old or new)", ExitCode.INTERRUPTED)
        except OutputWriteError as exc:
            _traceback_if_debug()
            fail(exc.strerror or str(exc), ExitCode.WRITE_FAILED)
        except RecursionError:
            _traceback_if_debug()
            fail("input nested too deeply (see docs/limits.md)")
        except _BAD_INPUT_OS_ERRORS as exc:
            _traceback_if_debug()
            fail(f"{exc.strerror}: {exc.filename}")
        except ValueError as exc:
            _traceback_if_debug()
            fail(str(exc))

    return wrapper  # type: ignore[return-value]
