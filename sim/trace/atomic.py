"""Whole bundles or none: stage a result bundle in a temporary sibling folder, then swap it into place.

:func:`staged_bundle` is the only way a bundle reaches its final path:

1. **Ownership check first.** The target must not be a symbolic link. If it exists, every entry in it
   must be a bundle's: a file its ``manifest.json`` lists, a sidecar (:data:`SIDECARS`), or a folder that
   is itself a whole bundle (e.g. ``replay/replayed/``). Anything else (a user's file, a link, a plain
   folder) is *foreign* and the write is refused with :class:`OutputFolderError` naming it, unless
   ``force=True``. (What is listed but was edited since, and nested bundles, are kept: see 4.)
2. **Stage.** The caller writes every file into a fresh folder ``.<name>.tmp-<pid>-<random>`` next to the
   target (same file system, so the final rename is atomic). Its first file is the stage marker
   (:data:`STAGE_MARKER`, naming the writer's process): only a folder holding it is ever treated as a
   stage. The folder is new and empty, so no link planted in an old bundle (``plots/``, ``replay/``,
   ``crash.json``) can be written through.
3. **Manifest last, then swap.** :meth:`Stage.finish` hashes every staged file, writes ``manifest.json``
   (tables with file, row count and SHA-256; every file's SHA-256; ``partial`` and its ``reason``), fsyncs
   files and folders, removes the marker and swaps the stage in at once, with no re-check in between:
   ``renameat2(RENAME_EXCHANGE)`` where the kernel has it (one atomic step), else rename-old-aside /
   rename-new-in.
4. **Then sort the old folder** (now at a marked stage name, so nobody adds to it): each file listed in its
   manifest with a matching hash is removed; everything else (a file added in the meantime, an edited one,
   a link, a nested bundle the user copied in) is moved aside to ``<target>.old`` (``.old-1``, ... if
   taken) and named in a note. Nothing that hybridsim cannot prove it wrote is ever deleted.
5. **Dead stages.** A stage (or an old folder being sorted) left by a process that no longer exists (SIGKILL,
   out-of-memory kill) is cleaned at the next bundle write into the same parent folder, for any target:
   only folders named like a stage *and* holding our marker whose process is gone. A user's folder named
   like a stage (``.target.tmp-999999-mydata``) has no marker and is never touched.
6. **Failure** (an exception, ``OSError`` such as ENOSPC, a second interrupt): the stage is removed and
   the previous bundle is untouched; an ``OSError`` becomes :class:`BundleWriteError`.

Signals are deferred while the stage is finished (:func:`sim.interrupts.deferred`): a first SIGINT/SIGTERM
waits until the swap is done, a second one aborts the write (old bundle untouched). A SIGKILL at any point
leaves either the old bundle or the new one at the target, plus at worst a ``.tmp`` stage folder.

:func:`check_bundle` validates a bundle against its manifest; see :class:`BundleCheck`.
"""

from __future__ import annotations

import ctypes
import errno
import hashlib
import json
import os
import re
import secrets
import shutil
import stat
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Iterator

from sim.interrupts import deferred, pause_point
from sim.trace.output import OutputWriteError, unstamped

MANIFEST_FILE = "manifest.json"
MANIFEST_FORMAT = "hybridsim-bundle"
MANIFEST_VERSION = 1
#: Files a tool other than the bundle writer puts in a bundle folder: the sweep's identity file (kept across
#: a rewrite) and a failed sweep run's traceback (dropped by a rewrite).
SIDECARS = ("sweep-run.json", "error.txt")
KEPT_SIDECARS = ("sweep-run.json",)
#: The first file of every stage folder: proof that hybridsim made the folder, and which process owns it.
STAGE_MARKER = ".hybridsim-stage"
_STAGE_NAME = re.compile(r"\A\..+\.tmp-(\d+)-[0-9a-f]{8}\Z")


class OutputFolderError(ValueError):
    """The output folder cannot be used as it is (a link, a file, or it holds files we did not write)."""


class BundleWriteError(OutputWriteError):
    """Writing the bundle failed at the OS level (disk full, I/O error); the previous bundle is untouched."""


class BundleError(ValueError):
    """A bundle whose manifest does not match its files (or that has none where one is required)."""


def sha256_file(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as fh:
        for chunk in iter(lambda: fh.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


# ---------------------------------------------------------------- ownership


def read_manifest(directory: Path) -> dict | None:
    """``directory``'s manifest if it is a regular file holding a manifest of ours, else None."""
    from sim.trace.bundle_files import read_json

    path = directory / MANIFEST_FILE
    try:
        if not stat.S_ISREG(path.lstat().st_mode):
            return None
        data = read_json(path, "bundle manifest")  # bounded (json_bytes): a 1 GiB manifest is no manifest
    except (OSError, ValueError):
        return None
    if not isinstance(data, dict) or data.get("format") != MANIFEST_FORMAT or not isinstance(data.get("files"), dict):
        return None
    return data


def _stamped_file(path: Path) -> bool:
    """Whether ``path`` (a regular file) carries a matching ownership stamp (:mod:`sim.trace.output`)."""
    try:
        if path.stat().st_size > 1 << 20:
            return False
        return unstamped(path.suffix, path.read_bytes()) is not None
    except OSError:
        return False


def _ours(directory: Path, rel: str, listed: dict, top: bool, strict: bool = True) -> bool:
    """Whether the regular file ``directory/rel`` is ours: listed in the manifest (``strict``: with the hash we
    wrote), a sidecar (``strict``: carrying its stamp), or the manifest itself."""
    path = directory / rel
    digest = listed.get(rel)
    if isinstance(digest, str):
        if not strict:
            return True
        try:
            return sha256_file(path) == digest
        except OSError:
            return False
    if top and rel in SIDECARS:
        return not strict or _stamped_file(path)
    return False


def _whole_bundle(folder: Path) -> bool:
    return read_manifest(folder) is not None and not foreign_entries(folder, strict=True)


def foreign_entries(directory: Path, *, strict: bool = False) -> list[str]:
    """Entries of ``directory`` (relative paths, sorted) that are not hybridsim's bundle files.

    Not foreign: ``manifest.json``, each file it lists, :data:`SIDECARS`, folders that are whole bundles
    themselves. Links and anything else are foreign (a write is refused without ``force``).
    ``strict`` (*what a rewrite keeps aside*): also a listed file whose content no longer has the listed
    hash (an edited file), a sidecar without its ownership stamp, and a nested bundle (a folder the manifest
    does not list): only what hybridsim can prove it wrote there is ever deleted.
    """
    manifest = read_manifest(directory)
    listed = dict(manifest["files"]) if manifest is not None else {}
    foreign: list[str] = []

    def walk(folder: Path, prefix: str) -> None:
        for entry in sorted(os.scandir(folder), key=lambda e: e.name):
            rel = prefix + entry.name
            if entry.is_symlink():
                foreign.append(rel)
            elif entry.is_dir(follow_symlinks=False):
                if any(name.startswith(rel + "/") for name in listed):
                    walk(Path(entry.path), rel + "/")
                elif strict or not _whole_bundle(Path(entry.path)):
                    foreign.append(rel + "/")
            elif not entry.is_file(follow_symlinks=False):
                foreign.append(rel)
            elif not prefix and entry.name == MANIFEST_FILE and manifest is not None:
                continue
            elif not _ours(directory, rel, listed, top=not prefix, strict=strict):
                foreign.append(rel)

    walk(directory, "")
    return foreign


def check_output_folder(target: Path, *, force: bool = False) -> str:
    """Why ``target`` may be written: ``"new"``, ``"empty"``, ``"ours"`` or ``"foreign"`` (``force`` only).

    Raises :class:`OutputFolderError` for a link, a non-folder, or foreign entries without ``force``.
    """
    try:
        mode = target.lstat().st_mode
    except FileNotFoundError:
        return "new"
    except OSError as exc:
        raise OutputFolderError(f"{target}: cannot use it ({exc.strerror}); give a writable directory path") from None
    if stat.S_ISLNK(mode):
        raise OutputFolderError(
            f"output folder {target} is a symbolic link; links are never followed, give the real folder"
        )
    if not stat.S_ISDIR(mode):
        raise OutputFolderError(f"output folder {target} exists and is not a folder")
    entries = os.listdir(target)
    if not entries:
        return "empty"
    foreign = foreign_entries(target)
    if not foreign:
        return "ours"
    if force:
        return "foreign"
    more = f" (and {len(foreign) - 1} more)" if len(foreign) > 1 else ""
    raise OutputFolderError(
        f"output folder {target} holds {target / foreign[0]}{more}, which hybridsim did not write; "
        "give an empty or new folder, or --force (the old folder is then kept as <folder>.old)"
    )


# ---------------------------------------------------------------- the swap


def _fsync_path(path: Path, directory: bool = False) -> None:
    fd = os.open(path, (os.O_RDONLY | os.O_DIRECTORY) if directory else os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


_RENAME_EXCHANGE = 2
_AT_FDCWD = -100


def _exchange(a: Path, b: Path) -> bool:
    """Atomically swap two paths (Linux ``renameat2``); False when the system cannot."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        fn = libc.renameat2
    except (OSError, AttributeError):
        return False
    fn.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_int, ctypes.c_char_p, ctypes.c_uint]
    if fn(_AT_FDCWD, os.fsencode(a), _AT_FDCWD, os.fsencode(b), _RENAME_EXCHANGE) == 0:
        return True
    err = ctypes.get_errno()
    if err in (errno.ENOSYS, errno.EINVAL, errno.ENOTSUP):
        return False
    raise OSError(err, os.strerror(err), str(a))


def _free_aside(target: Path) -> Path:
    candidate = target.with_name(target.name + ".old")
    n = 0
    while os.path.lexists(candidate):
        n += 1
        candidate = target.with_name(f"{target.name}.old-{n}")
    return candidate


def _write_marker(folder: Path, kind: str) -> None:
    """The stage marker, created with O_EXCL | O_NOFOLLOW in a folder we just made."""
    text = json.dumps({"format": "hybridsim-stage", "kind": kind, "pid": os.getpid()}) + "\n"
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | getattr(os, "O_CLOEXEC", 0)
    fd = os.open(folder / STAGE_MARKER, flags, 0o644)
    with os.fdopen(fd, "w", encoding="utf-8") as fh:
        fh.write(text)


def _read_marker(folder: Path) -> dict | None:
    path = folder / STAGE_MARKER
    try:
        if not stat.S_ISREG(path.lstat().st_mode) or path.lstat().st_size > 4096:
            return None
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    if not isinstance(data, dict) or data.get("format") != "hybridsim-stage" or not isinstance(data.get("pid"), int):
        return None
    return data


def _stage_name(target: Path) -> Path:
    return target.with_name(f".{target.name}.tmp-{os.getpid()}-{secrets.token_hex(4)}")


def sort_old(old: Path, target: Path) -> list[str]:
    """Empty the replaced folder ``old`` of what is provably ours (files listed in its manifest with the
    hash we wrote, stamped sidecars, its manifest, our marker) and move what remains to ``<target>.old``
    (``.old-N``); returns the notes naming what was kept. ``old`` may be anything the swap found at the
    target (a link or a file is moved aside whole)."""
    try:
        mode = old.lstat().st_mode
    except FileNotFoundError:
        return []
    if stat.S_ISDIR(mode):
        manifest = read_manifest(old)
        listed = dict(manifest["files"]) if manifest is not None else {}
        for root, dirs, names in os.walk(old, topdown=False):
            folder = Path(root)
            for name in names:
                rel = (folder / name).relative_to(old).as_posix()
                path = folder / name
                if path.is_symlink() or not path.is_file():
                    continue
                if rel == STAGE_MARKER or _ours(old, rel, listed, top="/" not in rel):
                    path.unlink()
            for name in dirs:
                try:
                    (folder / name).rmdir()  # only when emptied; a link to a folder is not removed by rmdir
                except OSError:
                    pass
        if (old / MANIFEST_FILE).is_file() and not (old / MANIFEST_FILE).is_symlink() and len(os.listdir(old)) == 1:
            (old / MANIFEST_FILE).unlink()
        if not os.listdir(old):
            old.rmdir()
            return []
        kept = foreign_entries(old, strict=True) if manifest is not None else sorted(os.listdir(old))
    else:
        kept = [old.name]
    aside = _free_aside(target)
    os.rename(old, aside)
    more = f" (and {len(kept) - 3} more)" if len(kept) > 3 else ""
    return [f"kept in {aside} what hybridsim did not write in {target}: {', '.join(kept[:3])}{more}"]


@dataclass
class Stage:
    """A bundle being written: write files under ``path``; record tables; :meth:`finish` swaps it in."""

    path: Path
    target: Path
    state: str
    partial: bool = False
    reason: str | None = None
    tables: dict[str, dict] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)
    finished: bool = False
    #: A folder that is not a run bundle says what it is (``golden``: tables only, no ``summary.json``).
    kind: str | None = None

    def record_table(self, name: str, file: Path, rows: int) -> None:
        self.tables[name] = {"file": file.relative_to(self.path).as_posix(), "rows": int(rows)}

    def _manifest(self) -> dict:
        files: dict[str, str] = {}
        for root, dirs, names in os.walk(self.path):
            dirs.sort()
            for name in sorted(names):
                full = Path(root) / name
                rel = full.relative_to(self.path).as_posix()
                if rel in (MANIFEST_FILE, STAGE_MARKER):
                    continue
                _fsync_path(full)
                files[rel] = sha256_file(full)
            _fsync_path(Path(root), directory=True)
        tables = {n: {**t, "sha256": files[t["file"]]} for n, t in sorted(self.tables.items())}
        manifest = {
            "format": MANIFEST_FORMAT,
            "version": MANIFEST_VERSION,
            "partial": self.partial,
            "reason": self.reason,
            "tables": tables,
            "files": files,
        }
        if self.kind is not None:
            manifest["kind"] = self.kind
        return manifest

    def finish(self) -> None:
        """Write the manifest, fsync, swap the stage into place at once, then sort the old folder (what is
        provably ours is removed, the rest kept aside and named in :attr:`notes`)."""
        with deferred():
            text = json.dumps(self._manifest(), indent=2, sort_keys=True) + "\n"
            pause_point("manifest")
            with open(self.path / MANIFEST_FILE, "w", encoding="utf-8") as fh:
                fh.write(text)
                fh.flush()
                os.fsync(fh.fileno())
            _fsync_path(self.path, directory=True)
            pause_point("swap")
            (self.path / STAGE_MARKER).unlink()  # the stage becomes the bundle: no marker inside it
            old = self._swap()
            _fsync_path(self.target.parent, directory=True)
            self.finished = True
            if old is not None:
                if stat.S_ISDIR(old.lstat().st_mode):
                    _write_marker(old, "old")
                pause_point("sort")
                self.notes.extend(sort_old(old, self.target))

    def _swap(self) -> Path | None:
        """Put the stage at the target in one step; the replaced folder's path (at a fresh stage name), if any."""
        if not os.path.lexists(self.target):
            try:
                os.rename(self.path, self.target)
                return None
            except OSError as exc:
                if exc.errno not in (errno.EEXIST, errno.ENOTEMPTY, errno.ENOTDIR, errno.EISDIR):
                    raise
        if _exchange(self.path, self.target):
            return self.path
        old = _stage_name(self.target)
        os.rename(self.target, old)
        os.rename(self.path, self.target)
        return old


def _process_gone(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    except PermissionError:
        return False  # alive, owned by someone else
    return False


def remove_dead_stages(parent: Path) -> list[str]:
    """Clean the debris of bundle writers that died in ``parent`` (SIGKILL, out-of-memory kill): folders named
    like a stage *and* holding our marker whose process no longer exists. A stage being written is removed;
    an old folder being sorted is sorted again (what we cannot prove ours is kept aside, never deleted).
    Anything without our marker (a user's folder named like a stage) is left alone. Returns notes."""
    notes: list[str] = []
    try:
        entries = list(os.scandir(parent))
    except OSError:
        return notes
    for entry in entries:
        match = _STAGE_NAME.match(entry.name)
        if match is None or entry.is_symlink() or not entry.is_dir(follow_symlinks=False):
            continue
        pid = int(match.group(1))
        folder = Path(entry.path)
        marker = _read_marker(folder)
        if marker is None or marker["pid"] != pid or pid == os.getpid() or not _process_gone(pid):
            continue
        target = parent / entry.name[1 : entry.name.rindex(".tmp-")]
        try:
            if marker.get("kind") == "old":
                notes.extend(sort_old(folder, target))
            else:
                shutil.rmtree(folder)
        except OSError:
            pass  # best effort: a concurrent cleaner, a permission problem
    return notes


@contextmanager
def staged_bundle(target: str | os.PathLike[str], *, force: bool = False) -> Iterator[Stage]:
    """Stage a bundle for ``target``; the caller writes into ``stage.path`` and calls :meth:`Stage.finish`.

    A stage left unfinished is discarded. On any exception the stage is removed and ``target`` is as it was; an ``OSError`` is re-raised as
    :class:`BundleWriteError` with one readable line.
    """
    from sim.trace.output import OutputPathError, ensure_folder

    target = Path(os.path.abspath(target))
    state = check_output_folder(target, force=force)
    path: Path | None = None
    try:
        ensure_folder(target.parent)
        notes = remove_dead_stages(target.parent)
        path = _stage_name(target)
        path.mkdir()
        _write_marker(path, "stage")
    except OutputPathError as exc:
        raise OutputFolderError(str(exc)) from None
    except OSError as exc:
        if path is not None:
            shutil.rmtree(path, ignore_errors=True)
        what = exc.strerror or str(exc)
        raise BundleWriteError(exc.errno, f"cannot create a folder next to {target}: {what}") from None
    stage = Stage(path=path, target=target, state=state, notes=notes)
    if state == "ours":
        for name in KEPT_SIDECARS:
            if (target / name).is_file() and not (target / name).is_symlink() and _stamped_file(target / name):
                shutil.copyfile(target / name, path / name)
    try:
        yield stage
        if not stage.finished:
            shutil.rmtree(path, ignore_errors=True)
    except OSError as exc:
        shutil.rmtree(path, ignore_errors=True)
        if isinstance(exc, BundleWriteError):
            raise
        what = exc.strerror or str(exc)
        raise BundleWriteError(
            exc.errno, f"cannot write the result bundle {target}: {what}; the previous contents are untouched"
        ) from None
    except BaseException:
        shutil.rmtree(path, ignore_errors=True)
        raise


def rewrite_bundle(
    directory: str | os.PathLike[str],
    update: Callable[[Path], None],
    *,
    drop: str = "plots/",
    keep: Callable[[str], bool] = lambda rel: False,
) -> list[str]:
    """Replace the bundle at ``directory`` whole with a copy whose files under ``drop`` are redrawn by
    ``update(stage_dir)`` (e.g. ``hybridsim plot``); files under ``drop`` for which ``keep(rel)`` holds are
    carried over (``plot --svg`` keeps the PNGs). The rest must match the manifest. Returns the notes."""
    d = Path(os.path.abspath(directory))
    check = check_bundle(d)
    problems = [p for p in check.problems if not p.startswith(drop)]
    if problems:
        raise BundleError(f"{d}: inconsistent bundle: {problems[0]}")
    manifest = read_manifest(d)
    assert manifest is not None
    with staged_bundle(d) as stage:
        stage.partial, stage.reason = check.partial, check.reason
        for rel in manifest["files"]:
            if not rel.startswith(drop) or keep(rel):
                (stage.path / rel).parent.mkdir(parents=True, exist_ok=True)
                shutil.copyfile(d / rel, stage.path / rel)
        for name, entry in manifest.get("tables", {}).items():
            stage.record_table(name, stage.path / entry["file"], entry["rows"])
        update(stage.path)
        stage.finish()
    return stage.notes


# ---------------------------------------------------------------- checking


@dataclass
class BundleCheck:
    """What :func:`check_bundle` found: ``problems`` (empty = consistent), ``partial`` and its ``reason``."""

    path: Path
    problems: list[str]
    partial: bool = False
    reason: str | None = None
    has_manifest: bool = True

    @property
    def ok(self) -> bool:
        return not self.problems

    def describe(self) -> str:
        if self.problems:
            return f"{self.path}: inconsistent bundle: {self.problems[0]}" + (
                f" (and {len(self.problems) - 1} more problems)" if len(self.problems) > 1 else ""
            )
        if self.partial:
            return f"{self.path}: partial bundle ({self.reason or 'no reason given'})"
        return f"{self.path}: complete bundle"


def _table_rows(path: Path) -> int:
    if path.suffix == ".parquet":
        import pyarrow.parquet as pq

        return pq.ParquetFile(path).metadata.num_rows
    import pandas as pd

    return len(pd.read_csv(path, dtype=str, keep_default_na=False))


def check_bundle(directory: str | os.PathLike[str]) -> BundleCheck:
    """Validate ``directory`` against its manifest: every listed file present (not a link) with its hash,
    every table's row count, no table file the manifest does not list, ``summary.json`` a mapping whose
    ``partial`` agrees with the manifest."""
    from sim.trace.bundle_files import BundleFileError, check_summary, member_path, read_json
    from sim.trace.tables import TABLE_NAMES

    d = Path(directory)
    manifest = read_manifest(d)
    if manifest is None:
        problem = f"{MANIFEST_FILE} is missing or unreadable (the bundle was not written whole, or by an older version)"
        return BundleCheck(d, [problem], has_manifest=False)
    problems: list[str] = []
    for rel, digest in sorted(manifest["files"].items()):
        path = member_path(d, rel)  # a listed name outside the bundle (/proc/self/mem, ../x) is never opened
        if path is None:
            problems.append(f"{MANIFEST_FILE} lists {str(rel)[:60]!r}, which is not a path inside the bundle")
        elif path.is_symlink() or not path.is_file():
            problems.append(f"{rel} is missing")
        elif sha256_file(path) != digest:
            problems.append(f"{rel} does not match its hash in {MANIFEST_FILE}")
    given_tables = manifest.get("tables")
    tables = given_tables if isinstance(given_tables, dict) else {}
    for name, entry in sorted(tables.items()):
        file = entry.get("file") if isinstance(entry, dict) else None
        if not isinstance(file, str) or file not in manifest["files"]:
            problems.append(f"table {name!r} has no file in {MANIFEST_FILE}")
            continue
        if member_path(d, file) is not None and (d / file).is_file() and not any(file in p for p in problems):
            try:
                rows = _table_rows(d / file)
            except Exception as exc:  # unreadable table: a problem to report, not a crash
                problems.append(f"{file} cannot be read ({type(exc).__name__})")
                continue
            if rows != entry.get("rows"):
                problems.append(f"{file} has {rows} rows, {MANIFEST_FILE} says {entry.get('rows')}")
    for name in TABLE_NAMES:
        for ext in ("parquet", "csv"):
            rel = f"{name}.{ext}"
            if os.path.lexists(d / rel) and rel not in manifest["files"]:
                problems.append(f"{rel} is not listed in {MANIFEST_FILE}")
    partial = manifest.get("partial") is True
    summary_file = d / "summary.json"
    if "summary.json" in manifest["files"] and summary_file.is_file():
        summary = None
        try:
            raw = read_json(summary_file, "run summary")
            if not isinstance(raw, dict) or not raw:
                problems.append("summary.json is not a non-empty JSON object")
            else:
                summary = check_summary(raw, summary_file)
        except BundleFileError as exc:
            problems.append(f"summary.json: {str(exc).removeprefix(f'{summary_file}: ')}")
        if summary is not None and summary.get("partial", False) is not partial:
            problems.append(f"summary.json says partial={summary.get('partial')!r}, {MANIFEST_FILE} {partial!r}")
    elif "summary.json" not in manifest["files"] and manifest.get("kind") != "golden":
        problems.append(f"summary.json is not listed in {MANIFEST_FILE}")
    reason = manifest.get("reason")
    return BundleCheck(d, problems, partial=partial, reason=reason if isinstance(reason, str) else None)
