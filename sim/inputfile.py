"""Input files: a regular file, checked before it is opened, read with a size bound, errors naming it.

Every file a command reads because a user named it (a scenario, sweep or grid file, a trace, an empirical
length table, a kernel profile, a hardware-overrides file, the entries of ``scenarios --dir``, the files of
a result bundle) is opened here, so one set of rules holds for all of them:

* **Regular files only.** The path is ``stat``-ed before it is opened: a directory, FIFO, socket or device
  is refused, and so is any file under ``/proc`` or ``/sys`` (pseudo-files report a size of 0 and produce
  data without end, or fail with EIO). The file is then opened with ``O_NONBLOCK`` (opening a FIFO that was
  swapped in after the check cannot hang) and checked again on the open descriptor, so what is read is the
  regular file that was checked.
* **Bounded.** A whole-file read fails before reading when the size is over the bound and reads at most
  ``bound + 1`` bytes, so a file that grows while it is read cannot exceed it either. A line-by-line read
  bounds each line (:func:`bounded_lines`), so one 200 MB line is refused after 16 MiB, not after reading it.
* **One line per error**, starting with the file's path: :class:`InputFileError` (a ``ValueError``; callers
  re-raise it as their own error type when they have one).

The bounds are limits of :mod:`sim.limits` (overridable by ``HYBRIDSIM_MAX_*``), listed in docs/limits.md.
"""

from __future__ import annotations

import os
import stat
from contextlib import contextmanager
from pathlib import Path
from typing import BinaryIO, Iterator

from sim.limits import limit, over

#: Folders of kernel pseudo-files: never read as input, whatever ``stat`` says they are.
PSEUDO_ROOTS = ("/proc", "/sys")

_KINDS = (
    (stat.S_ISDIR, "a directory"),
    (stat.S_ISFIFO, "a FIFO (named pipe)"),
    (stat.S_ISCHR, "a character device"),
    (stat.S_ISBLK, "a block device"),
    (stat.S_ISSOCK, "a socket"),
)


class InputFileError(ValueError):
    """An input file that cannot be read as one: ``str()`` is one line starting with the file's path."""


def _kind(mode: int) -> str | None:
    """What a non-regular file is (``None`` for a regular file)."""
    if stat.S_ISREG(mode):
        return None
    for test, name in _KINDS:
        if test(mode):
            return name
    return "not a regular file"


def _pseudo(path: Path) -> bool:
    resolved = os.path.realpath(path)
    return any(resolved == root or resolved.startswith(root + "/") for root in PSEUDO_ROOTS)


def check_regular(path: str | os.PathLike[str], what: str) -> os.stat_result:
    """The ``stat`` of ``path`` if it is a regular file outside /proc and /sys; else :class:`InputFileError`.

    A link is followed (a link to a regular file is that file); ``what`` names the kind of file in the
    message (``"scenario"``, ``"trace"``)."""
    p = Path(path)
    try:
        st = os.stat(p)
    except FileNotFoundError:
        raise InputFileError(f"{p}: cannot read {what}: file not found") from None
    except OSError as exc:
        raise InputFileError(f"{p}: cannot read {what} ({exc.strerror or type(exc).__name__})") from None
    kind = _kind(st.st_mode)
    if kind is not None:
        raise InputFileError(f"{p}: cannot read {what}: it is {kind}, not a regular file")
    if _pseudo(p):
        raise InputFileError(f"{p}: cannot read {what}: it is a kernel pseudo-file (/proc, /sys), not a file")
    return st


@contextmanager
def open_input(path: str | os.PathLike[str], what: str) -> Iterator[tuple[BinaryIO, os.stat_result]]:
    """``(binary file, stat)`` of the regular file ``path``: checked before opening and again once open."""
    p = Path(path)
    check_regular(p, what)
    flags = os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_NOCTTY", 0) | getattr(os, "O_CLOEXEC", 0)
    try:
        fd = os.open(p, flags)
    except OSError as exc:
        raise InputFileError(f"{p}: cannot read {what} ({exc.strerror or type(exc).__name__})") from None
    st = os.fstat(fd)
    kind = _kind(st.st_mode)
    if kind is not None:
        os.close(fd)
        raise InputFileError(f"{p}: cannot read {what}: it is {kind}, not a regular file")
    with os.fdopen(fd, "rb") as fh:
        yield fh, st


def _too_big(p: Path, what: str, size: int, limit_name: str) -> InputFileError:
    return InputFileError(f"{p}: cannot read {what}: " + over(limit_name, size, f"the file has {size} bytes"))


def read_bytes(path: str | os.PathLike[str], what: str, limit_name: str) -> bytes:
    """The bytes of the regular file ``path``, at most limit ``limit_name`` of them (else an error, before
    reading when the size says so)."""
    p = Path(path)
    bound = limit(limit_name)
    with open_input(p, what) as (fh, st):
        if st.st_size > bound:
            raise _too_big(p, what, st.st_size, limit_name)
        try:
            data = fh.read(bound + 1)
        except OSError as exc:
            raise InputFileError(f"{p}: cannot read {what} ({exc.strerror or type(exc).__name__})") from None
    if len(data) > bound:
        raise _too_big(p, what, len(data), limit_name)
    return data


def decode_utf8(data: bytes, path: str | os.PathLike[str], what: str) -> str:
    """``data`` as UTF-8 text; bad bytes are an error naming the file and the byte offset."""
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise InputFileError(
            f"{path}: not UTF-8 text (byte {exc.start}: {data[exc.start : exc.start + 1]!r}); save the {what} as UTF-8"
        ) from None


def read_text(path: str | os.PathLike[str], what: str, limit_name: str) -> str:
    """:func:`read_bytes` decoded as UTF-8 (bad bytes name the file and the byte offset)."""
    return decode_utf8(read_bytes(path, what, limit_name), path, what)


def read_head(path: str | os.PathLike[str], what: str, size: int) -> bytes:
    """At most the first ``size`` bytes of the regular file ``path`` (e.g. a scenario's header comment)."""
    with open_input(path, what) as (fh, _):
        try:
            return fh.read(size)
        except OSError as exc:
            raise InputFileError(f"{path}: cannot read {what} ({exc.strerror or type(exc).__name__})") from None


def bounded_lines(fh: BinaryIO, path: str | os.PathLike[str], what: str) -> Iterator[tuple[int, bytes]]:
    """``(line number, line)`` of an open input file, each line at most limit ``line_bytes`` long (a longer
    one is an error naming the file and line, raised after reading ``line_bytes + 1`` bytes of it)."""
    bound = limit("line_bytes")
    line_no = 0
    while True:
        raw = fh.readline(bound + 1)
        if not raw:
            return
        line_no += 1
        if len(raw) > bound and not raw.endswith(b"\n"):
            raise InputFileError(
                f"{path}:{line_no}: cannot read {what}: "
                + over("line_bytes", len(raw), f"the line is longer than {bound} bytes")
            )
        yield line_no, raw
