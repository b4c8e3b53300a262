"""Whole bundles or none: kill windows driven by real signals, disk errors, output-folder ownership, manifests.

Every test ends by asking what is at the output folder: the old bundle byte for byte, a whole new bundle, or a
whole bundle marked partial with its reason; never a mix (checked by :func:`check_bundle` and by hashes).
"""

from __future__ import annotations

import errno
import json
import os
import resource
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from support.cli import CRASHING, invoke

from sim.trace.atomic import check_bundle, foreign_entries

#: Not in the unit tier (`make test-fast`): end to end: runs in subprocesses interrupted by real signals.
pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]
BASE = ROOT / "tests" / "bad_input" / "base.yaml"


def snapshot(folder: Path) -> dict[str, bytes]:
    return {p.relative_to(folder).as_posix(): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


@pytest.fixture
def old_bundle(tmp_path: Path) -> tuple[Path, dict[str, bytes]]:
    out = tmp_path / "out"
    assert invoke("run", BASE, "-o", out, "--no-plots", "-q").exit_code == 0
    assert check_bundle(out).ok
    return out, snapshot(out)


def start(out: Path, pause: str, *extra: str) -> subprocess.Popen:
    env = {**os.environ, "HYBRIDSIM_TEST_PAUSE": pause}
    cmd = [
        sys.executable,
        "-m",
        "sim",
        "run",
        str(BASE),
        "-o",
        str(out),
        "--no-plots",
        "-q",
        "--set",
        "name=newer",
        *extra,
    ]
    proc = subprocess.Popen(cmd, env=env, stderr=subprocess.PIPE, stdout=subprocess.PIPE, text=True, cwd=ROOT)
    assert proc.stderr is not None
    line = proc.stderr.readline()
    assert line.startswith("paused at"), line + proc.stderr.read()
    return proc


def finish(proc: subprocess.Popen) -> tuple[int, str]:
    _, err = proc.communicate(timeout=120)
    assert "Traceback" not in err, err
    return proc.returncode, err


def no_stage_left(out: Path) -> bool:
    return not [p for p in out.parent.iterdir() if p.name.startswith(f".{out.name}.tmp-")]


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_signal_mid_run_writes_a_whole_bundle_marked_partial(old_bundle, sig) -> None:
    out, _ = old_bundle
    proc = start(out, "run:30")
    proc.send_signal(sig)
    code, err = finish(proc)
    assert code == 130, err
    check = check_bundle(out)
    assert check.ok and check.partial, check.problems
    assert check.reason == f"interrupted: interrupted ({sig.name})"
    summary = json.loads((out / "summary.json").read_text())
    assert summary["name"] == "newer" and summary["partial"] is True and summary["status"] == "interrupted"
    assert no_stage_left(out)
    shown = invoke("show", out)
    assert shown.exit_code == 0 and "PARTIAL" in shown.stdout + shown.stderr


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
@pytest.mark.parametrize("point", ["write", "manifest", "swap", "sort"])
def test_a_signal_while_a_finished_run_writes_its_bundle_lands_it_whole(old_bundle, sig, point) -> None:
    """The run has finished: a first signal while its tables, manifest or swap are written is held until the
    new bundle is in place (not partial: the run was complete); the process then exits 130 saying so."""
    out, before = old_bundle
    proc = start(out, f"{point}:2")
    proc.send_signal(sig)
    code, err = finish(proc)
    assert code == 130, err
    lines = err.splitlines()
    assert lines[0].startswith(f"{sig.name}: the run has finished; writing its bundle first"), err
    assert lines[-1].startswith(f"error: interrupted ({sig.name})") and len(lines) == 2, err
    check = check_bundle(out)
    assert check.ok and not check.partial, check.problems
    assert json.loads((out / "summary.json").read_text())["name"] == "newer"
    assert no_stage_left(out) and not list(out.parent.glob("out.old*"))


def test_one_signal_while_the_manifest_is_written_lands_the_new_bundle_whole(old_bundle) -> None:
    out, before = old_bundle
    proc = start(out, "manifest:2")
    proc.send_signal(signal.SIGTERM)
    code, _ = finish(proc)
    assert code == 130
    check = check_bundle(out)
    assert check.ok and not check.partial
    assert json.loads((out / "summary.json").read_text())["name"] == "newer"
    assert no_stage_left(out)


def test_second_signal_while_finishing_aborts_and_keeps_the_old_bundle(old_bundle) -> None:
    out, before = old_bundle
    proc = start(out, "manifest:30")
    proc.send_signal(signal.SIGTERM)
    time.sleep(0.3)
    proc.send_signal(signal.SIGTERM)
    code, _ = finish(proc)
    assert code == 130
    assert snapshot(out) == before and no_stage_left(out)


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_a_signal_while_the_command_line_starts_exits_130_and_keeps_the_old_bundle(old_bundle, sig) -> None:
    """While the interpreter imports the command line (about a second), before any command: exit 130 with one
    line (it was 143 and silent for SIGTERM, a traceback for SIGINT); nothing written, the old bundle intact."""
    out, before = old_bundle
    proc = start(out, "start:30")
    proc.send_signal(sig)
    code, err = finish(proc)
    assert code == 130, err
    assert err.splitlines() == [f"error: interrupted ({sig.name}) while starting; nothing was written"], err
    assert snapshot(out) == before and no_stage_left(out)


def test_sigkill_before_the_swap_keeps_the_old_bundle(old_bundle) -> None:
    out, before = old_bundle
    proc = start(out, "swap:30")
    proc.kill()
    proc.communicate(timeout=60)
    assert snapshot(out) == before and check_bundle(out).ok
    assert not no_stage_left(out)  # the killed writer's stage is there ...
    assert invoke("run", BASE, "-o", out, "--no-plots", "-q").exit_code == 0
    assert no_stage_left(out)  # ... until the next write clears it (its process is gone)


def _limit_file_size() -> None:
    resource.setrlimit(resource.RLIMIT_FSIZE, (3000, 3000))


def test_a_write_error_exits_1_in_one_line_and_keeps_the_old_bundle(old_bundle) -> None:
    """A real OS write error (RLIMIT_FSIZE: EFBIG, as ENOSPC would be) midway through the tables."""
    out, before = old_bundle
    cmd = [
        sys.executable,
        "-m",
        "sim",
        "run",
        str(BASE),
        "-o",
        str(out),
        "--no-plots",
        "-q",
        "--format",
        "csv",
        "--set",
        "workload.requests.0.max_tokens=400",
    ]
    done = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT, preexec_fn=_limit_file_size, timeout=120)
    assert done.returncode == 1, done.stderr
    assert done.stderr.startswith("error: cannot write the result bundle") and "File too large" in done.stderr
    assert len(done.stderr.splitlines()) == 1 and "previous contents are untouched" in done.stderr
    assert snapshot(out) == before and no_stage_left(out)


def test_disk_full_in_process(old_bundle, monkeypatch) -> None:
    import sim.trace.bundle as bundle

    out, before = old_bundle

    def full(*args, **kwargs):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(bundle, "write_table", full)
    res = invoke("run", BASE, "-o", out, "--no-plots", "-q")
    assert res.exit_code == 1 and "No space left on device" in res.stderr and "Traceback" not in res.output
    assert snapshot(out) == before


# ---------------------------------------------------------------- replacing a previous bundle


def test_rerun_replaces_the_bundle_whole_no_stale_crash_files(tmp_path: Path) -> None:
    crash = tmp_path / "crash.yaml"
    crash.write_text(CRASHING)
    out = tmp_path / "out"
    assert invoke("run", crash, "-o", out, "-q").exit_code == 3
    assert (out / "crash.json").is_file() and (out / "replay" / "replay.yaml").is_file()
    assert (out / "plots").is_dir()
    assert invoke("run", BASE, "-o", out, "-q").exit_code == 0
    assert not (out / "crash.json").exists() and not (out / "replay").exists()
    assert check_bundle(out).ok and not foreign_entries(out)


def test_format_switch_leaves_no_stale_table(tmp_path: Path) -> None:
    out = tmp_path / "out"
    assert invoke("run", BASE, "-o", out, "--no-plots", "-q").exit_code == 0
    assert invoke("run", BASE, "-o", out, "--no-plots", "-q", "--format", "csv").exit_code == 0
    assert not list(out.glob("*.parquet")) and check_bundle(out).ok


def test_replay_of_a_stale_or_tampered_bundle_is_refused(tmp_path: Path) -> None:
    crash = tmp_path / "crash.yaml"
    crash.write_text(CRASHING)
    out = tmp_path / "out"
    assert invoke("run", crash, "-o", out, "--no-plots", "-q").exit_code == 3
    (out / "summary.json").write_text("{}")
    res = invoke("replay", out / "replay")
    assert res.exit_code == 2 and "summary.json" in res.stderr


def test_replay_without_or_with_a_malformed_crash_json(tmp_path: Path) -> None:
    crash = tmp_path / "crash.yaml"
    crash.write_text(CRASHING)
    out = tmp_path / "out"
    assert invoke("run", crash, "-o", out, "--no-plots", "-q").exit_code == 3
    copy = tmp_path / "copy"
    copy.mkdir()
    (copy / "replay.yaml").write_text((out / "replay" / "replay.yaml").read_text())
    res = invoke("replay", copy, "-o", tmp_path / "r1")
    assert res.exit_code == 2 and "crash.json is missing" in res.stderr and "Traceback" not in res.output
    (copy / "crash.json").write_text("[1, 2]")
    res = invoke("replay", copy, "-o", tmp_path / "r2")
    assert res.exit_code == 2 and "must be a JSON object" in res.stderr and "(list)" in res.stderr
    (copy / "crash.json").write_text(json.dumps({"step": 99, "request_id": "r1", "reason": "x"}))
    res = invoke("replay", copy, "-o", tmp_path / "r3")
    assert res.exit_code == 1 and "NOT reproduced" in res.stdout


# ---------------------------------------------------------------- output-folder ownership


def test_a_folder_with_user_files_is_refused_unless_force(tmp_path: Path) -> None:
    out = tmp_path / "mine"
    out.mkdir()
    (out / "requests.csv").write_text("my data\n")
    (out / "summary.json").write_text('{"mine": true}\n')
    res = invoke("run", BASE, "-o", out, "--no-plots", "-q")
    assert res.exit_code == 2 and "requests.csv (and 1 more), which hybridsim did not write" in res.stderr
    assert len(res.stderr.splitlines()) == 1
    assert (out / "requests.csv").read_text() == "my data\n" and (
        out / "summary.json"
    ).read_text() == '{"mine": true}\n'
    res = invoke("run", BASE, "-o", out, "--no-plots", "-q", "--force")
    assert res.exit_code == 0, res.output
    assert check_bundle(out).ok
    kept = tmp_path / "mine.old"
    assert (kept / "requests.csv").read_text() == "my data\n" and f"kept in {kept}" in res.stderr


def test_a_user_file_added_to_a_bundle_is_refused(old_bundle) -> None:
    out, _ = old_bundle
    (out / "notes.txt").write_text("mine\n")
    res = invoke("run", BASE, "-o", out, "--no-plots", "-q")
    assert res.exit_code == 2 and "notes.txt" in res.stderr
    assert (out / "notes.txt").read_text() == "mine\n"


def test_links_are_never_followed(tmp_path: Path, old_bundle) -> None:
    out, before = old_bundle
    outside = tmp_path / "outside"
    outside.mkdir()
    (out / "plots").symlink_to(outside, target_is_directory=True)
    res = invoke("run", BASE, "-o", out, "-q")
    assert res.exit_code == 2 and "plots/" not in res.stderr.split("holds")[0] and "plots" in res.stderr
    assert invoke("run", BASE, "-o", out, "-q", "--force").exit_code == 0
    assert list(outside.iterdir()) == []  # plots were drawn into the new bundle, not through the link
    assert (out / "plots").is_dir() and not (out / "plots").is_symlink()

    link = tmp_path / "link"
    link.symlink_to(out, target_is_directory=True)
    res = invoke("run", BASE, "-o", link, "--no-plots", "-q")
    assert res.exit_code == 2 and "symbolic link" in res.stderr


def test_crash_json_link_in_an_old_bundle_is_not_written_through(tmp_path: Path) -> None:
    crash = tmp_path / "crash.yaml"
    crash.write_text(CRASHING)
    out = tmp_path / "out"
    assert invoke("run", crash, "-o", out, "--no-plots", "-q").exit_code == 3
    victim = tmp_path / "victim.txt"
    victim.write_text("keep\n")
    (out / "crash.json").unlink()
    (out / "crash.json").symlink_to(victim)
    assert invoke("run", crash, "-o", out, "--no-plots", "-q").exit_code == 2
    assert invoke("run", crash, "-o", out, "--no-plots", "-q", "--force").exit_code == 3
    assert victim.read_text() == "keep\n" and not (out / "crash.json").is_symlink()


@pytest.mark.parametrize("name", ["..", ".", "../../x", "/abs/path", "a/b", "x\x00y", ".hidden", "-rf", " padded"])
def test_unsafe_names_are_refused(tmp_path: Path, monkeypatch, name: str) -> None:
    monkeypatch.chdir(tmp_path)
    (tmp_path / "user.txt").write_text("keep\n")
    res = invoke("run", BASE, "--no-plots", "-q", "--set", f"name={json.dumps(name)}")
    assert res.exit_code == 2 and "name:" in res.stderr and len(res.stderr.splitlines()) == 1, res.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == ["user.txt"]


def test_duplicate_names_in_one_invocation_are_refused(tmp_path: Path) -> None:
    other = tmp_path / "other.yaml"
    other.write_text(BASE.read_text())
    res = invoke("run", BASE, other, "-o", tmp_path / "out", "--no-plots", "-q")
    assert res.exit_code == 2 and "name: 'base' is also the name of" in res.stderr
    assert not (tmp_path / "out").exists()


# ---------------------------------------------------------------- validating bundles


def test_show_and_diff_refuse_an_inconsistent_bundle(tmp_path: Path, old_bundle) -> None:
    out, _ = old_bundle
    good = tmp_path / "good"
    assert invoke("run", BASE, "-o", good, "--no-plots", "-q").exit_code == 0
    (out / "admissions.parquet").unlink()
    for res in (invoke("show", out), invoke("trace", "diff", good, out), invoke("trace", "diff", out, good)):
        assert res.exit_code == 2 and "admissions.parquet is missing" in res.stderr
    assert invoke("run", BASE, "-o", out, "--no-plots", "-q").exit_code == 0  # still ours: replaced whole


def test_hash_row_count_and_empty_summary_are_caught(tmp_path: Path, old_bundle) -> None:
    out, _ = old_bundle
    (out / "summary.json").write_text("{}")
    check = check_bundle(out)
    assert "summary.json does not match its hash in manifest.json" in check.problems
    assert "summary.json is not a non-empty JSON object" in check.problems
    manifest = json.loads((out / "manifest.json").read_text())
    manifest["tables"]["kv_events"]["rows"] += 1
    (out / "manifest.json").write_text(json.dumps(manifest))
    assert any("rows, manifest.json says" in p for p in check_bundle(out).problems)


def test_diff_flags_partial_and_unverified_bundles(tmp_path: Path, old_bundle) -> None:
    out, _ = old_bundle
    partial = tmp_path / "partial"
    from sim.trace.bundle import load_result, write_result

    loaded = load_result(out)
    write_result(partial, scenario_yaml="", summary={"x": 1}, tables=loaded.tables, partial=True, reason="stopped")
    res = invoke("trace", "diff", out, partial)
    assert res.exit_code == 2 and "partial bundle (stopped)" in res.stderr and "--allow-partial" in res.stderr
    res = invoke("trace", "diff", out, partial, "--allow-partial")
    assert res.exit_code == 0 and "warning:" in res.stdout and "partial bundle (stopped)" in res.stdout
    (partial / "manifest.json").unlink()
    res = invoke("trace", "diff", out, partial)
    assert res.exit_code == 2 and "unverified bundle" in res.stderr
