"""sim.inputfile: regular files only, checked before opening, read with a size bound, one-line errors."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from sim.inputfile import InputFileError, bounded_lines, check_regular, open_input, read_bytes, read_head, read_text


def test_a_regular_file_is_read(tmp_path: Path) -> None:
    path = tmp_path / "s.yaml"
    path.write_text("name: x\n")
    assert read_text(path, "scenario", "yaml_bytes") == "name: x\n"


@pytest.mark.parametrize(
    "special, kind",
    [("fifo", "FIFO"), ("/dev/zero", "character device"), ("dir", "directory"), ("/dev/null", "character device")],
)
def test_special_files_are_refused_before_opening(tmp_path: Path, special: str, kind: str) -> None:
    path = Path(special)
    if special == "fifo":
        path = tmp_path / "x.yaml"
        os.mkfifo(path)  # opening it for reading would block until a writer comes: it must never be opened
    elif special == "dir":
        path = tmp_path / "x.yaml"
        path.mkdir()
    with pytest.raises(InputFileError) as exc:
        read_text(path, "scenario", "yaml_bytes")
    assert str(exc.value).startswith(f"{path}: cannot read scenario: it is ")
    assert kind in str(exc.value) and "\n" not in str(exc.value)


@pytest.mark.parametrize("path", ["/proc/self/mem", "/proc/self/status", "/sys/kernel/mm/transparent_hugepage/enabled"])
def test_kernel_pseudo_files_are_refused(path: str) -> None:
    if not os.path.exists(path):
        pytest.skip(f"{path} does not exist here")
    with pytest.raises(InputFileError, match="pseudo-file"):
        read_bytes(path, "trace file", "yaml_bytes")


def test_a_link_to_a_device_is_refused(tmp_path: Path) -> None:
    link = tmp_path / "s.yaml"
    link.symlink_to("/dev/zero")
    with pytest.raises(InputFileError, match="character device"):
        read_text(link, "scenario", "yaml_bytes")


def test_the_size_bound_is_checked_before_reading(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "big.json"
    with open(path, "wb") as fh:
        fh.truncate(1 << 30)  # a sparse 1 GiB file: reading it would cost 1 GiB
    with pytest.raises(InputFileError, match="HYBRIDSIM_MAX_JSON_BYTES") as exc:
        read_bytes(path, "summary", "json_bytes")
    assert f"the file has {1 << 30} bytes" in str(exc.value)
    monkeypatch.setenv("HYBRIDSIM_MAX_YAML_BYTES", "4")
    small = tmp_path / "s.yaml"
    small.write_text("name: x\n")
    with pytest.raises(InputFileError, match="more than the limit of 4"):
        read_text(small, "scenario", "yaml_bytes")


def test_non_utf8_names_the_byte(tmp_path: Path) -> None:
    path = tmp_path / "s.yaml"
    path.write_bytes(b"name: caf\xe9\n")
    with pytest.raises(InputFileError, match=r"not UTF-8 text \(byte 9: b'\\xe9'\)"):
        read_text(path, "scenario", "yaml_bytes")


def test_missing_file(tmp_path: Path) -> None:
    with pytest.raises(InputFileError, match="cannot read trace file: file not found"):
        check_regular(tmp_path / "nope.jsonl", "trace file")


def test_bounded_lines_refuse_a_long_line_after_reading_the_bound(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setenv("HYBRIDSIM_MAX_LINE_BYTES", "16")
    path = tmp_path / "t.jsonl"
    path.write_bytes(b"short\n" + b"x" * 15 + b"\n" + b"y" * 100 + b"\n")
    with open_input(path, "trace file") as (fh, _):
        lines = bounded_lines(fh, path, "trace file")
        assert next(lines) == (1, b"short\n")
        assert next(lines) == (2, b"x" * 15 + b"\n")  # 16 bytes with its newline: within the bound
        with pytest.raises(InputFileError, match=rf"^{path}:3: .*HYBRIDSIM_MAX_LINE_BYTES"):
            next(lines)
        assert fh.tell() == 6 + 16 + 17  # it read the bound plus one byte of line 3, not the whole line


def test_read_head_reads_only_the_start(tmp_path: Path) -> None:
    path = tmp_path / "s.yaml"
    path.write_bytes(b"# title\n" + b"x" * 100_000)
    assert read_head(path, "scenario", 8) == b"# title\n"
