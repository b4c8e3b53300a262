"""The one file writer (sim.trace.output): stamps prove ownership, links are never followed, a file hybridsim
did not write is never replaced without force (and then kept aside), and a failed write leaves the old file."""

from __future__ import annotations

import errno
import io
import json
import os
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from sim.trace.output import (
    OutputPathError,
    OutputWriteError,
    check_output_file,
    open_output_dir,
    stamp,
    unstamped,
    write_file,
)


def _png() -> bytes:
    from matplotlib.figure import Figure

    fig = Figure(figsize=(1, 1))
    fig.subplots().plot([0, 1])
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png")
    return buffer.getvalue()


@given(st.binary(max_size=300), st.sampled_from([".py", ".yaml", ".yml", ".txt", ".md", ".svg"]))
def test_a_stamp_proves_exactly_the_content_it_was_made_for(data: bytes, suffix: str) -> None:
    stamped = stamp(suffix, data)
    assert stamped is not None
    body = unstamped(suffix, stamped)
    assert body is not None and body.rstrip(b"\n") == data.rstrip(b"\n")
    assert unstamped(suffix, stamped + b"x\n") is None  # anything appended: not ours any more
    assert unstamped(suffix, b"edit" + stamped) is None  # anything changed before the stamp: not ours


def test_png_and_json_stamps_keep_the_file_valid() -> None:
    from PIL import Image

    png = _png()
    stamped = stamp(".png", png)
    assert stamped is not None and unstamped(".png", stamped) == png
    Image.open(io.BytesIO(stamped)).load()
    assert unstamped(".png", stamped[:100] + b"\x00" + stamped[101:]) is None
    text = (json.dumps({"a": [1, 2], "b": "x"}, indent=2) + "\n").encode()
    stamped = stamp(".json", text)
    assert stamped is not None and unstamped(".json", stamped) == text
    assert json.loads(stamped)["a"] == [1, 2]
    assert unstamped(".json", stamped.replace(b'"x"', b'"y"')) is None
    assert stamp(".csv", b"a,b\n") is None and unstamped(".csv", b"a,b\n") is None


def test_own_file_is_replaced_a_user_file_is_kept(tmp_path: Path) -> None:
    out = tmp_path / "made" / "here" / "x.yaml"
    write_file(out, "k: 1\n")
    write_file(out, "k: 2\n")  # ours, unedited: replaced without force
    assert out.read_text().startswith("k: 2\n")
    out.write_text(out.read_text() + "# my note\n")  # edited: no longer provably ours
    with pytest.raises(OutputPathError, match="hybridsim did not write it"):
        write_file(out, "k: 3\n")
    notes: list[str] = []
    write_file(out, "k: 3\n", force=True, notes=notes)
    assert out.read_text().startswith("k: 3\n") and "# my note" in (tmp_path / "made/here/x.yaml.old").read_text()
    assert notes and "x.yaml.old" in notes[0]
    user = tmp_path / "notes.md"
    user.write_text("mine\n")
    with pytest.raises(OutputPathError):
        check_output_file(user)
    assert user.read_text() == "mine\n"


def test_links_are_refused_at_the_target_and_in_folders_hybridsim_owns(tmp_path: Path) -> None:
    victim = tmp_path / "victim.txt"
    victim.write_text("keep\n")
    link = tmp_path / "out.yaml"
    link.symlink_to(victim)
    for force in (False, True):
        with pytest.raises(OutputPathError, match="symbolic link"):
            write_file(link, "x: 1\n", force=force)
    assert victim.read_text() == "keep\n" and link.is_symlink()
    # A planted link below an output folder (here DIR/plots -> elsewhere) is refused, not written through.
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    folder = tmp_path / "DIR"
    folder.mkdir()
    (folder / "plots").symlink_to(elsewhere, target_is_directory=True)
    with pytest.raises(OutputPathError, match="symbolic link"):
        write_file(folder / "plots" / "a.md", "x\n", within=folder)
    assert list(elsewhere.iterdir()) == []
    linked_dir = tmp_path / "linked"
    linked_dir.symlink_to(elsewhere, target_is_directory=True)
    with pytest.raises(OutputPathError, match="symbolic link"), open_output_dir(linked_dir):
        pass


def test_a_linked_parent_folder_is_the_users_choice(tmp_path: Path) -> None:
    real = tmp_path / "data"
    real.mkdir()
    (tmp_path / "results").symlink_to(real, target_is_directory=True)
    write_file(tmp_path / "results" / "sub" / "x.md", "hello\n")
    assert (real / "sub" / "x.md").read_text().startswith("hello\n")


def test_a_planted_temporary_name_is_never_written_through(tmp_path: Path) -> None:
    victim = tmp_path / "victim.txt"
    victim.write_text("keep\n")
    (tmp_path / "shrunk.yaml.tmp").symlink_to(victim)
    (tmp_path / ".shrunk.yaml.tmp").symlink_to(victim)
    write_file(tmp_path / "shrunk.yaml", "a: 1\n")
    assert victim.read_text() == "keep\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        ".shrunk.yaml.tmp",
        "shrunk.yaml",
        "shrunk.yaml.tmp",
        "victim.txt",
    ]


def test_a_failed_write_leaves_the_old_file_and_no_temporary(tmp_path: Path) -> None:
    out = tmp_path / "x.yaml"
    write_file(out, "old: 1\n")
    before = out.read_bytes()

    def broken(fh) -> None:
        fh.write(b"half")
        raise OSError(errno.ENOSPC, "No space left on device")

    with pytest.raises(OutputWriteError, match="No space left on device; the previous contents are untouched"):
        write_file(out, broken)
    assert out.read_bytes() == before and sorted(os.listdir(tmp_path)) == ["x.yaml"]


def test_a_read_only_file_system_is_one_line(tmp_path: Path, monkeypatch) -> None:
    def erofs(*args, **kwargs):
        raise OSError(errno.EROFS, "Read-only file system")

    monkeypatch.setattr(os, "mkdir", erofs)
    with pytest.raises(OutputWriteError) as info:
        write_file(tmp_path / "new" / "x.md", "x\n")
    assert "Read-only file system" in info.value.strerror and "\n" not in info.value.strerror
