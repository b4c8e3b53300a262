"""What commands share for their output: the rich console, the progress switch, the end-of-run summary table,
and the checks of a run's ``-o`` folder before anything runs."""

from __future__ import annotations

import hashlib
import os
import re
import sys
from pathlib import Path
from typing import Any, List, Optional, Sequence


def console() -> Any:
    """A rich console; piped output is not cut to 80 columns (rich's default without a terminal)."""
    from rich.console import Console

    return Console() if sys.stdout.isatty() else Console(width=200)


def terminal_text(text: str, *, keep_newlines: bool = True) -> str:
    """``text`` for the terminal: every non-printable character (ESC, OSC, BEL, bidi overrides, and with
    ``keep_newlines=False`` the newline too) written as its escape (``\\x1b``), so a string from a scenario,
    a trace or a bundle cannot move the cursor, retitle the window or hide text. Printable text is unchanged."""
    if text.isprintable():
        return text
    return "".join(
        c if c.isprintable() or (keep_newlines and c == "\n") else c.encode("unicode_escape").decode("ascii")
        for c in text
    )


def show_progress() -> bool:
    """Progress bars only on a terminal, and never under CI."""
    return sys.stderr.isatty() and not os.environ.get("CI")


def print_summary(summary: dict, title: str = "") -> None:
    """The end-of-run table: latency, hits, divergence, outcomes, evictions; for a cluster, then one row
    per instance (:func:`sim.analysis.report.instance_table`)."""
    from rich.table import Table
    from rich.text import Text

    from sim.analysis.report import instance_table, summary_rows

    # Text cells, never markup: a path, name or id holding "[/]" or "[bold]" is printed as it is.
    table = Table(title=Text(terminal_text(title)) if title else None, show_header=False, box=None, pad_edge=False)
    table.add_column("metric", style="bold")
    table.add_column("value")
    for name, value in summary_rows(summary):
        table.add_row(Text(terminal_text(name)), Text(terminal_text(value)))
    console().print(table)
    header, rows = instance_table(summary)
    if rows:  # a cluster: one row per instance
        per = Table(title=Text("per instance"), show_header=True, box=None, pad_edge=False)
        for i, name in enumerate(header):
            per.add_column(Text(name), justify="left" if i == 0 else "right")
        for row in rows:
            per.add_row(*(Text(terminal_text(cell)) for cell in row))
        console().print(per)


def force_option(what: str = "file") -> Any:
    """The ``--force`` option of a command that writes a ``what`` (file or folder contents)."""
    import typer

    return typer.Option(
        False,
        "--force",
        help=f"Replace a {what} hybridsim did not write (or one edited since); the old one is kept as <name>.old.",
    )


def warn(notes: List[str]) -> None:
    """The writer's notes (what was kept aside) as ``warning:`` lines on stderr."""
    import typer

    for note in notes:
        typer.echo(f"warning: {terminal_text(note, keep_newlines=False)}", err=True)


def prepare_out_dir(target: Path, force: bool = False) -> None:
    """Check ``-o`` before running, so an unusable output folder fails in a second, not after the run:
    not a link or a file, holding nothing hybridsim did not write (unless ``force``), parent writable."""
    from sim.config import ScenarioError
    from sim.trace.atomic import OutputFolderError, check_output_folder

    try:
        check_output_folder(Path(os.path.abspath(target)), force=force)
    except OutputFolderError as exc:
        raise ScenarioError(f"-o/--out {exc}") from None
    from sim.trace.output import OutputPathError, ensure_folder

    parent = Path(os.path.abspath(target)).parent
    try:
        ensure_folder(parent)  # made without following links
    except OutputPathError as exc:
        raise ScenarioError(f"-o/--out {exc}") from None
    except OSError as exc:
        raise ScenarioError(
            f"-o/--out {target}: cannot create the output directory ({exc.strerror}); give a writable directory path"
        ) from exc
    if not os.access(parent, os.W_OK):
        raise ScenarioError(f"-o/--out {target}: the output directory is not writable; give a writable directory path")


#: The longest override suffix of a default folder name kept as written (a longer one is cut and ends in a
#: digest of the whole, so the name stays well under the file system's 255 bytes).
_SUFFIX_MAX = 96


def default_folder_name(name: str, overrides: Sequence[str]) -> str:
    """The default ``-o`` folder name of a run: the scenario's ``name``, or with ``--set``/``--seed`` overrides
    ``name@key=value,key=value`` (each character outside ``A-Za-z0-9._=-`` written ``_``), so that a run with
    overrides never replaces the bundle of the run as written, and two different override lists never share a
    folder (a suffix cut for length ends in a digest of the full list)."""
    if not overrides:
        return name
    suffix = ",".join(re.sub(r"[^A-Za-z0-9._=-]", "_", item) for item in overrides)
    if len(suffix) > _SUFFIX_MAX:
        digest = hashlib.sha256("\0".join(overrides).encode("utf-8")).hexdigest()[:12]
        suffix = f"{suffix[: _SUFFIX_MAX - 13]}~{digest}"
    return f"{name}@{suffix}"


def run_targets(
    scenarios: List[Path], names: List[str], out: Optional[Path], overrides: Sequence[str] = ()
) -> List[Path]:
    """One output folder per scenario; names are path-safe (checked by the scenario model); two scenarios
    with the same name in one invocation are refused (they would overwrite each other). Without ``-o`` the
    folder is ``results/`` + :func:`default_folder_name` (``overrides``: the user's ``--set``/``--seed``)."""
    from sim.config import ScenarioError

    seen: dict[str, Path] = {}
    for path, name in zip(scenarios, names):
        if name in seen and (out is None or len(scenarios) > 1):
            raise ScenarioError(
                f"{path}: name: {name!r} is also the name of {seen[name]}; two runs in one "
                "invocation would write the same folder (rename one)"
            )
        seen[name] = path
    if out is None:
        return [Path("results") / default_folder_name(name, overrides) for name in names]
    if len(scenarios) > 1:
        return [out / name for name in names]
    return [out]
