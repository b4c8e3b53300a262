"""After a crash: ``replay`` a crash bundle, ``shrink`` a scenario keeping its cause, ``export vllm-test``."""

# No ``from __future__ import annotations`` here: typer evaluates every command's parameter annotations, which
# strings would make a compile and an eval each (about 0.003 s of every command, docs/speed.md).

import json
from pathlib import Path
from typing import List, Optional

import typer

from sim.cli.app import app, export_app
from sim.cli.errors import fail, handles_errors
from sim.cli.exit_codes import ExitCode
from sim.cli.output import force_option, prepare_out_dir, show_progress, warn


# ------------------------------------------------------------------- replay
@app.command()
@handles_errors
def replay(
    bundle: Path = typer.Argument(..., help="A replay bundle (directory with replay.yaml) written on a crash."),
    out: Optional[Path] = typer.Option(None, "-o", "--out", help="Output directory."),
    shrink: bool = typer.Option(
        False, "--shrink", help="Then shrink it (keeping the crash) into <bundle>/shrunk.yaml."
    ),
    force: bool = force_option("folder or file"),
) -> None:
    """Re-run a crash replay bundle and check that the same crash happens (exit 1 when it does not)."""
    from sim.api import RunOptions, run_scenario
    from sim.config import load_scenario
    from sim.trace.output import check_output_file

    scenario_file = bundle / "replay.yaml" if bundle.is_dir() else bundle
    if not scenario_file.is_file():
        fail(f"{bundle}: no replay.yaml (a replay bundle is written next to crash.json when a run crashes)")
    expected_file = scenario_file.parent / "crash.json"
    expected = _read_crash_json(expected_file)
    _check_enclosing_bundle(scenario_file.parent)
    scenario = load_scenario(scenario_file)
    target = out or scenario_file.parent / "replayed"
    prepare_out_dir(target, force)
    if shrink:
        check_output_file(scenario_file.parent / "shrunk.yaml", force=force, option="--shrink")
    result = run_scenario(scenario, target, options=RunOptions(progress=False, force=force))
    warn(result.notes)
    crash = result.crash
    typer.echo(f"crash: {json.dumps(crash, sort_keys=True)}")
    same = crash is not None and all(crash.get(k) == expected.get(k) for k in ("step", "request_id", "reason"))
    typer.echo("reproduced" if same else "NOT reproduced")
    if not same:
        raise typer.Exit(ExitCode.DIFF)
    if shrink:
        shrink_cmd(
            source=scenario_file,
            out=scenario_file.parent / "shrunk.yaml",
            keep="auto",
            contrast="pr48425",
            set_=[],
            quiet=False,
            force=force,
        )


def _read_crash_json(path: Path) -> dict:
    """The expected crash of a replay bundle: a JSON object with step, request_id and reason."""
    from sim.config import ScenarioError

    if path.is_symlink() or not path.is_file():
        raise ScenarioError(f"{path}: crash.json is missing; a replay bundle holds replay.yaml and crash.json")
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (ValueError, UnicodeDecodeError) as exc:
        raise ScenarioError(f"{path}: crash.json is not valid JSON ({type(exc).__name__})") from None
    missing = [k for k in ("step", "request_id", "reason") if not isinstance(data, dict) or k not in data]
    if not isinstance(data, dict) or missing:
        got = type(data).__name__ if not isinstance(data, dict) else f"missing {', '.join(missing)}"
        raise ScenarioError(f"{path}: crash.json must be a JSON object with step, request_id and reason ({got})")
    return data


def _check_enclosing_bundle(replay_dir: Path) -> None:
    """A replay folder inside a run bundle (``RUN/replay``) must belong to a whole bundle that matches its
    manifest: a stale or tampered copy is refused rather than 'reproduced'."""
    from sim.trace.atomic import BundleError, check_bundle

    parent = replay_dir.resolve().parent
    if replay_dir.name == "replay" and (parent / "summary.json").is_file():
        check = check_bundle(parent)
        if not check.ok:
            raise BundleError(check.describe())


# ------------------------------------------------------------------- shrink
@app.command("shrink")
@handles_errors
def shrink_cmd(
    source: Path = typer.Argument(..., help="A scenario YAML, or a result/replay bundle (its replay.yaml is used)."),
    out: Path = typer.Option(..., "-o", "--out", help="The shrunk scenario YAML to write."),
    keep: str = typer.Option(
        "auto",
        "--keep",
        help="Property to keep: auto (contrast if the policy causes it, else divergence), crash-reason, outcome, "
        "divergence, contrast or first-difference (needs vLLM).",
    ),
    contrast: str = typer.Option(
        "pr48425", "--contrast", help="The prefix policy under which a contrast must run clean."
    ),
    set_: List[str] = typer.Option([], "--set", help="Override a key of the input first: key.path=value."),
    quiet: bool = typer.Option(False, "-q", "--quiet", help="No progress bar."),
    force: bool = force_option(),
) -> None:
    """Delta-debug a scenario down to a small one that keeps its crash or outcome and its cause (docs/shrink.md)."""
    from sim.shrink.command import run_shrink

    notes: list[str] = []
    result = run_shrink(
        source, out, keep, set_, progress=show_progress() and not quiet, contrast=contrast, force=force, notes=notes
    )
    warn(notes)
    if result.isolated:
        typer.echo(result.isolated)
    typer.echo(f"{out}: {result.property.describe()}")
    typer.echo(f"  {result.before.line(result.after)}; {result.candidates} candidate runs, {result.wall_s:.1f}s")
    if result.interrupted:
        typer.echo(f"interrupted: wrote the smallest scenario found so far to {out}", err=True)
        raise typer.Exit(ExitCode.INTERRUPTED)


@export_app.command("vllm-test")
@handles_errors
def export_vllm_test_cmd(
    scenario: Path = typer.Argument(..., help="A step-clock scenario YAML (e.g. the output of hybridsim shrink)."),
    out: Path = typer.Option(..., "-o", "--out", help="The pytest module to write (test_*.py)."),
    force: bool = force_option(),
) -> None:
    """Write a self-contained pytest that replays SCENARIO in vLLM 0.33 and asserts what hybridsim observed."""
    from sim.config import load_scenario
    from sim.export.vllm_test import export_vllm_test, write_module
    from sim.trace.output import check_output_file

    check_output_file(out, force=force, option="-o/--out")
    notes: list[str] = []
    write_module(out, export_vllm_test(load_scenario(scenario), str(scenario)), force=force, notes=notes)
    warn(notes)
    typer.echo(f"{out}: run it with: VLLM_TARGET_DEVICE=cpu python -m pytest {out}")


@export_app.command("kv-events")
@handles_errors
def export_kv_events_cmd(
    bundle: Path = typer.Argument(..., help="A result bundle."),
    out: Path = typer.Option(..., "-o", "--out", help="The msgpack file to write (vLLM's KVEventBatch stream)."),
    hash_seed: str = typer.Option(
        "vllm-none-hash", "--hash-seed", help="The PYTHONHASHSEED of the vLLM to match (default: vLLM's own default)."
    ),
    int_hashes: bool = typer.Option(
        False, "--int-hashes", help="Block hashes as 64-bit ints (VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES)."
    ),
    instance: Optional[int] = typer.Option(None, "--instance", help="A cluster bundle's instance."),
    force: bool = typer.Option(False, "--force", help="Replace an existing file."),
) -> None:
    """Write BUNDLE's KV events in vLLM's own event stream format (msgpack KVEventBatch, sha256_cbor hashes)."""
    from sim.export.kv_events import ExportError, export_kv_events, write_events

    try:
        data = export_kv_events(bundle, hash_seed=hash_seed, int_hashes=int_hashes, instance=instance)
        write_events(out, data, force=force)
    except ExportError as exc:
        fail(str(exc))
    typer.echo(f"{out}: {len(data)} bytes of vLLM KV event batches")
