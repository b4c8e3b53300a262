"""The one way a hybridsim command writes a file outside a bundle's stage: no link followed, no file that
hybridsim did not write replaced without ``force``, and never half a file.

Rules of :func:`write_file` (the bundle writer, :mod:`sim.trace.atomic`, keeps the same ones for folders):

* **The output path itself is never a link.** A symbolic link at the target is refused (one line naming
  it); the linked file is never opened. Folders the writer creates (``mkdir -p``) are created one component
  at a time and opened with ``O_NOFOLLOW`` relative to their parent's descriptor, so a link planted in
  place of a folder just created is refused, not followed. Folders that already exist on the path are the
  user's choice and are used as given (``~/results -> /data/results`` works).
* **Ownership by proof.** An existing file is replaced only when hybridsim provably wrote it and nobody
  edited it since: every file the writer produces carries a *stamp*, the SHA-256 of its own content, in a
  place its format allows (:func:`stamp`): a final ``# hybridsim-output sha256=...`` line (Python, YAML,
  text), an HTML comment (Markdown, SVG), a ``tEXt`` chunk before ``IEND`` (PNG), a last key
  ``"hybridsim-output"`` (a JSON object). A file whose stamp is missing or does not match (a user's file,
  an edited one) is *foreign*. Formats without room for a stamp (CSV, Parquet) are proven by a ledger the
  caller keeps (``known_sha256``: e.g. ``sweep.json`` lists ``sweep.parquet``'s hash); without one, any
  existing file there is foreign.
* **A foreign file is never overwritten without ``force``**; with it, the old file is kept aside as
  ``<name>.old`` (``.old-1``, ... if taken) and a note says so. Nothing is deleted.
* **Atomic replace.** The content goes to a temporary file in the same folder, created with
  ``O_CREAT | O_EXCL | O_NOFOLLOW`` (a planted ``<name>.tmp`` link is never written through: the name is
  fresh and the open refuses links), is fsynced, and is renamed over the target in one step; a failure or an
  interrupt removes the temporary file and leaves the target as it was.

:func:`open_output_dir` gives callers that write several files into one folder (``compare -o``, ``fuzz -o``)
the same folder rules.
"""

from __future__ import annotations

import errno
import hashlib
import os
import re
import secrets
import stat
import struct
import zlib
from contextlib import contextmanager
from pathlib import Path
from typing import BinaryIO, Callable, Iterator

#: What every stamp says, in whatever syntax its format allows.
STAMP_KEY = "hybridsim-output"
#: A file larger than this is not read to check its stamp (it is treated as foreign).
MAX_STAMPED_BYTES = 256 << 20

_HASH_FORMATS = (".py", ".yaml", ".yml", ".txt")
_COMMENT_FORMATS = (".md", ".svg")
_PNG_END = b"\x00\x00\x00\x00IEND\xaeB`\x82"


class OutputPathError(ValueError):
    """An output path that cannot be used as it is: a link, not a file, or a file hybridsim did not write."""


class OutputWriteError(OSError):
    """Writing failed at the OS level (read-only file system, disk full, no permission); one readable line in
    ``strerror``; the previous file (or bundle) is untouched."""


def write_error(exc: OSError, what: str) -> OutputWriteError:
    """``exc`` as one line: ``cannot write <what>: <reason>; the previous contents are untouched``."""
    reason = exc.strerror or str(exc)
    return OutputWriteError(exc.errno, f"cannot write {what}: {reason}; the previous contents are untouched")


Content = bytes | str | Callable[[BinaryIO], object]


# ---------------------------------------------------------------- stamps


def _digest(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _png_chunk(digest: str) -> bytes:
    body = b"tEXt" + STAMP_KEY.encode() + b"\x00sha256=" + digest.encode()
    return struct.pack(">I", len(body) - 4) + body + struct.pack(">I", zlib.crc32(body))


_PNG_CHUNK_LEN = len(_png_chunk("0" * 64))
_JSON_TAIL = re.compile(rb',\n  "' + STAMP_KEY.encode() + rb'": "sha256=([0-9a-f]{64})"\n}\n\Z')
_LINE_TAIL = re.compile(rb"(?:\A|\n)(# |<!-- )" + STAMP_KEY.encode() + rb" sha256=([0-9a-f]{64})(?: -->)?\n\Z")


def stamp(suffix: str, data: bytes) -> bytes | None:
    """``data`` with its ownership stamp for a file ending in ``suffix``; None when the format has no room
    for one (CSV, Parquet, an empty JSON object, a PNG without ``IEND``)."""
    suffix = suffix.lower()
    digest = _digest(data)
    if suffix in _HASH_FORMATS or suffix in _COMMENT_FORMATS:
        body = data if not data or data.endswith(b"\n") else data + b"\n"
        digest = _digest(body)
        if suffix in _HASH_FORMATS:
            return body + f"# {STAMP_KEY} sha256={digest}\n".encode()
        return body + f"<!-- {STAMP_KEY} sha256={digest} -->\n".encode()
    if suffix == ".png" and data.endswith(_PNG_END):
        return data[: -len(_PNG_END)] + _png_chunk(digest) + _PNG_END
    if suffix == ".json" and data.startswith(b"{") and data.endswith(b"\n}\n"):
        return data[:-3] + f',\n  "{STAMP_KEY}": "sha256={digest}"\n}}\n'.encode()
    return None


def unstamped(suffix: str, data: bytes) -> bytes | None:
    """The content ``data`` was stamped over, if ``data`` carries a stamp that matches it; else None."""
    suffix = suffix.lower()
    if suffix in _HASH_FORMATS or suffix in _COMMENT_FORMATS:
        m = _LINE_TAIL.search(data)
        if m is None or (m.group(1) == b"# ") != (suffix in _HASH_FORMATS):
            return None
        body = data[: m.start(1)]
        return body if _digest(body) == m.group(2).decode() else None
    if suffix == ".png":
        cut = len(data) - len(_PNG_END) - _PNG_CHUNK_LEN
        if cut < 0 or not data.endswith(_PNG_END):
            return None
        body = data[:cut] + _PNG_END
        return body if data[cut : -len(_PNG_END)] == _png_chunk(_digest(body)) else None
    if suffix == ".json":
        m = _JSON_TAIL.search(data)
        if m is None:
            return None
        body = data[: m.start()] + b"\n}\n"
        return body if _digest(body) == m.group(1).decode() else None
    return None


# ---------------------------------------------------------------- folders


def _refuse_link(path: Path) -> OutputPathError:
    return OutputPathError(f"{path} is a symbolic link; hybridsim never writes through a link: give the real path")


def _open_dir_fd(folder: Path, within: Path | None = None) -> int:
    """A descriptor of ``folder`` (absolute), creating missing components without following links.

    Existing components above ``within`` (or above the first missing one) are used as they are: a user's
    link there is their choice. ``within`` (an output folder of ours, itself never a link) and every
    component below it, and every component this creates, is opened with ``O_NOFOLLOW`` relative to its
    parent (made with ``mkdir`` first if missing), so a link planted there (or swapped in for a folder just
    made) is refused rather than followed."""
    if within is not None and folder != within and within not in folder.parents:
        raise ValueError(f"{folder} is not inside {within}")
    flags = os.O_RDONLY | os.O_DIRECTORY | getattr(os, "O_CLOEXEC", 0)
    if within is not None:
        base, parts = within.parent, [within.name, *folder.relative_to(within).parts]
        fd = _open_dir_fd(base)
    else:
        base, parts = folder, []
        while not os.path.lexists(base):
            parts.insert(0, base.name)
            base = base.parent
        try:
            fd = os.open(base, flags)
        except NotADirectoryError:
            raise OutputPathError(f"{base} is not a folder") from None
        except FileNotFoundError:
            raise OutputPathError(f"{base} is a dangling symbolic link; give a path through real folders") from None
    try:
        here = base
        for name in parts:
            here = here / name
            try:
                os.mkdir(name, 0o777, dir_fd=fd)
            except FileExistsError:
                pass  # there already (or made by a concurrent writer): checked by the open below
            try:
                child = os.open(name, flags | os.O_NOFOLLOW, dir_fd=fd)
            except OSError as exc:
                if exc.errno in (errno.ELOOP, errno.ENOTDIR):
                    kind = "a symbolic link" if os.path.islink(here) else "not a folder"
                    raise OutputPathError(
                        f"{here} is {kind}; hybridsim never writes through a link: give the real path"
                    ) from None
                raise
            os.close(fd)
            fd = child
    except BaseException:
        os.close(fd)
        raise
    return fd


def ensure_folder(folder: str | os.PathLike[str]) -> None:
    """Create ``folder`` and its missing parents without following links (see :func:`_open_dir_fd`);
    existing components, links included, are used as given. ``OSError`` propagates."""
    os.close(_open_dir_fd(Path(os.path.abspath(folder))))


@contextmanager
def open_output_dir(folder: str | os.PathLike[str]) -> Iterator[int]:
    """A descriptor of the output folder ``folder`` (created with its missing parents) for the duration of
    the block; the folder itself must be a real folder, never a link (see :func:`_open_dir_fd`)."""
    path = Path(os.path.abspath(folder))
    try:
        fd = _open_dir_fd(path, within=path)
    except OutputPathError:
        raise
    except OSError as exc:
        raise write_error(exc, f"into {path}") from None
    try:
        yield fd
    finally:
        os.close(fd)


# ---------------------------------------------------------------- files


def _read_bounded(name: str, dir_fd: int, size: int) -> bytes | None:
    if size > MAX_STAMPED_BYTES:
        return None
    fd = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | getattr(os, "O_CLOEXEC", 0), dir_fd=dir_fd)
    with os.fdopen(fd, "rb") as fh:
        return fh.read(MAX_STAMPED_BYTES + 1)


def existing_state(path: Path, dir_fd: int, known_sha256: str | None = None) -> str:
    """``"new"``, ``"ours"`` (stamped, unedited; or matching ``known_sha256``) or ``"foreign"`` for the
    name ``path.name`` in the folder ``dir_fd``; a link or a non-file raises :class:`OutputPathError`."""
    try:
        st = os.stat(path.name, dir_fd=dir_fd, follow_symlinks=False)
    except FileNotFoundError:
        return "new"
    if stat.S_ISLNK(st.st_mode):
        raise _refuse_link(path)
    if not stat.S_ISREG(st.st_mode):
        raise OutputPathError(f"{path} exists and is not a regular file")
    data = _read_bounded(path.name, dir_fd, st.st_size)
    if data is None:
        return "foreign"
    if known_sha256 is not None and _digest(data) == known_sha256:
        return "ours"
    return "ours" if unstamped(path.suffix, data) is not None else "foreign"


def _foreign(path: Path, option: str) -> OutputPathError:
    prefix = f"{option} " if option else ""
    return OutputPathError(
        f"{prefix}{path} exists and hybridsim did not write it (or it was edited since); "
        "give another path, or --force (the old file is then kept as <name>.old)"
    )


def check_output_file(
    path: str | os.PathLike[str], *, force: bool = False, known_sha256: str | None = None, option: str = ""
) -> None:
    """Fail fast, before a long computation, when :func:`write_file` would refuse ``path``: a link, not a
    regular file, or (without ``force``) a file hybridsim did not write. A missing folder is fine."""
    target = Path(os.path.abspath(path))
    try:
        fd = os.open(target.parent, os.O_RDONLY | os.O_DIRECTORY | getattr(os, "O_CLOEXEC", 0))
    except FileNotFoundError:
        return
    except NotADirectoryError:
        raise OutputPathError(f"{option + ' ' if option else ''}{target.parent} is not a folder") from None
    except OSError as exc:
        raise write_error(exc, str(target)) from None
    try:
        if existing_state(target, fd, known_sha256) == "foreign" and not force:
            raise _foreign(target, option)
    except OSError as exc:
        raise write_error(exc, str(target)) from None
    finally:
        os.close(fd)


def _free_aside(name: str, dir_fd: int) -> str:
    candidate, n = f"{name}.old", 0
    while True:
        try:
            os.stat(candidate, dir_fd=dir_fd, follow_symlinks=False)
        except FileNotFoundError:
            return candidate
        n += 1
        candidate = f"{name}.old-{n}"


def write_in(
    dir_fd: int,
    path: Path,
    content: Content,
    *,
    force: bool = False,
    known_sha256: str | None = None,
    notes: list[str] | None = None,
    option: str = "",
    stamped: bool = True,
) -> None:
    """Write ``content`` as ``path.name`` in the open folder ``dir_fd`` (``path`` names it in messages).

    ``content``: bytes, text (UTF-8), or a callable writing to a binary file (streamed, not stamped).
    ``stamped=False`` leaves bytes and text unstamped (files inside a bundle's stage, proven by its manifest).
    An ``OSError`` becomes :class:`OutputWriteError` (one line)."""
    try:
        _write_in(dir_fd, path, content, force, known_sha256, notes, option, stamped)
    except (OutputPathError, OutputWriteError):
        raise
    except OSError as exc:
        raise write_error(exc, str(path)) from None


def _write_in(
    dir_fd: int,
    path: Path,
    content: Content,
    force: bool,
    known_sha256: str | None,
    notes: list[str] | None,
    option: str,
    stamped: bool,
) -> None:
    state = existing_state(path, dir_fd, known_sha256)
    if state == "foreign" and not force:
        raise _foreign(path, option)
    data: bytes | None = (
        content.encode("utf-8") if isinstance(content, str) else content if isinstance(content, bytes) else None
    )
    if data is not None and stamped:
        data = stamp(path.suffix, data) or data
    tmp = f".{path.name}.tmp-{os.getpid()}-{secrets.token_hex(4)}"
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | getattr(os, "O_CLOEXEC", 0)
    fd = os.open(tmp, flags, 0o666, dir_fd=dir_fd)
    try:
        with os.fdopen(fd, "wb") as fh:
            if data is not None:
                fh.write(data)
            else:
                assert callable(content)
                content(fh)
            fh.flush()
            os.fsync(fh.fileno())
        if state == "foreign":
            aside = _free_aside(path.name, dir_fd)
            os.rename(path.name, aside, src_dir_fd=dir_fd, dst_dir_fd=dir_fd)
            if notes is not None:
                notes.append(f"{path} was not written by hybridsim: it is kept as {path.with_name(aside)}")
        # A link planted at the target since the check is replaced itself (rename never follows it).
        os.rename(tmp, path.name, src_dir_fd=dir_fd, dst_dir_fd=dir_fd)
        os.fsync(dir_fd)
    except BaseException:
        try:
            os.unlink(tmp, dir_fd=dir_fd)
        except OSError:
            pass
        raise


def write_file(
    path: str | os.PathLike[str],
    content: Content,
    *,
    force: bool = False,
    known_sha256: str | None = None,
    notes: list[str] | None = None,
    option: str = "",
    stamped: bool = True,
    within: str | os.PathLike[str] | None = None,
) -> Path:
    """Write ``content`` to ``path`` under the rules of this module; returns ``path`` (absolute).

    ``within``: the output folder ``path`` lies in (``sweep -o DIR``, ``compare -o DIR``): it and every
    folder between it and the file must be real folders, never links (they are hybridsim's to create).

    ``force`` replaces a foreign file (kept aside, a line appended to ``notes``); ``option`` (e.g.
    ``-o/--out``) prefixes the refusal message."""
    target = Path(os.path.abspath(path))
    try:
        fd = _open_dir_fd(target.parent, Path(os.path.abspath(within)) if within is not None else None)
    except OutputPathError:
        raise
    except OSError as exc:
        raise write_error(exc, str(target)) from None
    try:
        write_in(
            fd, target, content, force=force, known_sha256=known_sha256, notes=notes, option=option, stamped=stamped
        )
    finally:
        os.close(fd)
    return target
